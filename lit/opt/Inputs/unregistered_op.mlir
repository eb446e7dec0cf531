// An op of a dialect nobody registered: IREE 3.13 segfaults on it.
func.func @f() {
  "foo.bar"() : () -> ()
  return
}
