import json, sys
sys.path.insert(0, "bench")
from class_table import kernel_of
import heldback as hb
from convbw_mlir.dispatch.select import learned_selector
from convbw_mlir.dispatch.variants import candidates
from convbw_mlir.plan import decide
sel = learned_selector("sm_90a")
def fam(v): return kernel_of(v.plan.to_dict() if v.plan else None).split()[0]
def rows(f):
    out={}
    for l in open(f):
        if l.startswith("| 0"):
            c=[x.strip() for x in l.split("|")[1:-1]]; out[c[0]]=c
    return out
A=rows(".art/results/heldback_b/table.md"); B=rows(".art/results/heldback_b2/table.md")
mA={p["key"]:p for p in json.load(open(".art/results/heldback_b/manifest.json"))["problems"]}
mB={p["key"]:p for p in json.load(open(".art/results/heldback_b2/manifest.json"))["problems"]}
import math
got=[]; miss=0; keys=[]
for i,(name,p) in enumerate(hb.problems(("bf16","f16"), hb.Path("bench/heldback/dense2d_b.tsv"))):
    key=f"{i:03d}-{name}.{p.dtype}"
    plan=decide(p,"sm_90a"); pf=kernel_of(plan.to_dict())
    opts=[v for v in candidates(p,"sm_90a",iree=False)]
    same=[v for v in opts if fam(v)==pf.split()[0]] or opts
    ch=sel.choose(p,opts)
    d=ch.plan.to_dict()
    def planof(m): 
        c=m["contenders"]["convbw[product]"]; return c.get("variant",{}).get("plan") or c.get("plan")
    t=None
    for M,T in ((mA,A),(mB,B)):
        pm=planof(M[key])
        if pm is not None and json.dumps(pm,sort_keys=True)==json.dumps(d,sort_keys=True):
            t=float(T[key][1]); cud=float(T[key][2]); break
    if t is None:
        miss+=1; print(f"{key[:46]:46} plan {pf:22} chosen {kernel_of(d):22} UNTIMED"); continue
    keys.append(key); got.append(cud/t); print(f"{key[:46]:46} plan {pf:22} chosen {kernel_of(d):22} {cud/t:.2f}")
print("timed",len(got),"untimed",miss,"geomean",math.exp(sum(map(math.log,got))/len(got)), "min",min(got), "<0.8", sum(g<0.8 for g in got))

g=lambda xs: math.exp(sum(map(math.log,xs))/len(xs))
print("same rows: v1", round(g([float(A[k][3]) for k in keys]),3), "v2", round(g([float(B[k][3]) for k in keys]),3), "constrained", round(g(got),3))
