// RUN: xdsl-opt %s --split-input-file --verify-diagnostics | filecheck %s
// Each malformed scan op is rejected with a message naming the op and the problem.

func.func @bad_axis(%a: memref<4x8xf32>, %h: memref<4x8xf32>) {
  scan.affine %a, %a into %h axis 2 : memref<4x8xf32>, memref<4x8xf32> -> memref<4x8xf32>
  func.return
}
// CHECK: 'scan.affine': axis 2 is out of range for rank-2 operands (expected 0 <= axis < 2)

// -----

func.func @bad_shape(%a: memref<4x8xf32>, %b: memref<4x9xf32>, %h: memref<4x8xf32>) {
  scan.affine %a, %b into %h axis 1 : memref<4x8xf32>, memref<4x9xf32> -> memref<4x8xf32>
  func.return
}
// CHECK: 'scan.affine': operand 'b' has shape (4x9), expected (4x8)

// -----

func.func @bad_init(%a: memref<4x8xf32>, %h0: memref<8xf32>, %h: memref<4x8xf32>) {
  scan.affine %a, %a init %h0 into %h axis 1 : memref<4x8xf32>, memref<4x8xf32>, memref<8xf32> -> memref<4x8xf32>
  func.return
}
// CHECK: 'scan.affine': operand 'init' (h without axis 1) has shape (8), expected (4)

// -----

func.func @bad_types(%a: memref<8xf32>, %b: memref<8xf64>, %h: memref<8xf32>) {
  scan.affine %a, %b into %h axis 0 : memref<8xf32>, memref<8xf64> -> memref<8xf32>
  func.return
}
// CHECK: 'scan.affine': operands 'a' (f32) and 'b' (f64) must have the same element type

// -----

func.func @bad_widen(%a: memref<8xf16>, %h: memref<8xf64>) {
  scan.affine %a, %a into %h axis 0 : memref<8xf16>, memref<8xf16> -> memref<8xf64>
  func.return
}
// CHECK: 'scan.affine': input element type f16 does not match state element type f64 (only f16/bf16 inputs may widen to an f32 state)

// -----

func.func @bad_state(%a: memref<8xi8>, %h: memref<8xi8>) {
  scan.affine %a, %a into %h axis 0 : memref<8xi8>, memref<8xi8> -> memref<8xi8>
  func.return
}
// CHECK: 'scan.affine': state element type i8 is not supported (expected f32, f64, i32, i64, complex<f32> or complex<f64>)

// -----

func.func @bad_arity(%a: memref<8xf32>, %o: memref<8xf32>) {
  scan.scan ins(%a : memref<8xf32>) outs(%o : memref<8xf32>) axis 0 {
  ^bb0(%x: f32):
    scan.yield %x : f32
  }
  func.return
}
// CHECK: 'scan.scan': combine region must take 2 arguments of types (f32, f32), got (f32)

// -----

func.func @bad_yield(%a: memref<8xf32>, %o: memref<8xf32>) {
  scan.scan ins(%a : memref<8xf32>) outs(%o : memref<8xf32>) axis 0 {
  ^bb0(%x: f32, %y: f32):
    scan.yield %x, %y : f32, f32
  }
  func.return
}
// CHECK: 'scan.scan': combine region must yield 1 values of types (f32), got (f32, f32)

// -----

func.func @bad_outs(%a: memref<8xf32>, %o: memref<8xf32>) {
  scan.scan ins(%a, %a : memref<8xf32>, memref<8xf32>) outs(%o : memref<8xf32>) axis 0 {
  ^bb0(%x: f32, %y: f32):
    scan.yield %x : f32
  }
  func.return
}
// CHECK: 'scan.scan': expected as many outputs as inputs (2), got 1

// -----

func.func @bad_scan_axis(%a: memref<8xf32>, %o: memref<8xf32>) {
  scan.scan ins(%a : memref<8xf32>) outs(%o : memref<8xf32>) axis 1 {
  ^bb0(%x: f32, %y: f32):
    scan.yield %x : f32
  }
  func.return
}
// CHECK: 'scan.scan': axis 1 is out of range for rank-1 operands (expected 0 <= axis < 1)

// -----

func.func @bad_coeffs(%h: memref<4xf32>) {
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %c1 = arith.constant 1 : index
  scan.recurrence %c0 to %c8 step %c1 state(%h : memref<4xf32>) coeffs {
  ^bb0(%i: index):
    %one = arith.constant 1.0 : f32
    scan.yield %one, %one : f32, f32
  } emit {
  ^bb0(%t: index, %s: memref<4xf32>):
    scan.yield
  }
  func.return
}
// CHECK: 'scan.recurrence': coeffs region must take 2 index arguments (the step index, then one per state dimension), got (index)

// -----

func.func @bad_emit(%h: memref<f32>) {
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %c1 = arith.constant 1 : index
  scan.recurrence %c0 to %c8 step %c1 state(%h : memref<f32>) coeffs {
  ^bb0(%i: index):
    %one = arith.constant 1.0 : f64
    scan.yield %one, %one : f64, f64
  } emit {
  ^bb0(%t: index, %s: memref<f32>):
    scan.yield
  }
  func.return
}
// CHECK: 'scan.recurrence': coeffs region must end with 'scan.yield %a, %b : f32, f32'
