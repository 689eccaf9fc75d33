// RUN: not scanweaver-opt %s 2>&1 | filecheck %s
// A parse error is one message with the location, not a Python traceback.

func.func @f() {
  "bogus.op"() : () -> ()
  func.return
}
// CHECK: scanweaver-opt: error: {{.*}}opt_parse_error.mlir:5:13
// CHECK: Operation bogus.op is not registered
// CHECK-NOT: Traceback
