// RUN: not scanweaver-opt %s -p scan-to-loops -o %t.out 2>&1 | filecheck %s
// RUN: not test -e %t.out
// scanweaver-opt reports a verification error as one message naming the op, with the
// failing op shown, exits non-zero, and writes no output file.

func.func @bad_axis(%a: memref<4x8xf32>, %h: memref<4x8xf32>) {
  scan.affine %a, %a into %h axis 2 : memref<4x8xf32>, memref<4x8xf32> -> memref<4x8xf32>
  func.return
}
// CHECK: scanweaver-opt: error: 'scan.affine': axis 2 is out of range for rank-2 operands (expected 0 <= axis < 2)
// CHECK: "scan.affine"(%a, %a, %h)
// CHECK-NOT: Traceback
