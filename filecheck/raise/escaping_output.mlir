// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// Transposed direct form II (scipy.signal.lfilter, issue 14 form 3): the output
// y = b0*x + s1 is computed from the previous state and stored.  It is affine in the
// state, so it becomes a third state component (row 2 of the companion matrix: y' =
// s1 + b0*x); s1' and s2' use its affine form; emit reads it back from state[2].

func.func @lfilter(%x: memref<8xf32>, %b0: f32, %b1: f32, %a1: f32, %y: memref<8xf32>) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : f32
  %r = scf.for %t = %c0 to %c8 step %c1 iter_args(%s1 = %zero) -> (f32) {
    %xv = memref.load %x[%t] : memref<8xf32>
    %bx0 = arith.mulf %b0, %xv : f32
    %yv = arith.addf %bx0, %s1 : f32
    memref.store %yv, %y[%t] : memref<8xf32>
    %bx1 = arith.mulf %b1, %xv : f32
    %ay = arith.mulf %a1, %yv : f32
    %s1n = arith.subf %bx1, %ay : f32
    scf.yield %s1n : f32
  }
  func.return %r : f32
}

// CHECK-LABEL: func.func @lfilter
// CHECK:         %[[S:.*]] = memref.alloca() : memref<2xf32>
// CHECK:         memref.store %zero, %[[S]][%{{.*}}] : memref<2xf32>
// CHECK:         %[[Z:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:    %[[I1:.*]] = arith.constant 1 : index
// CHECK-NEXT:    memref.store %[[Z]], %[[S]][%[[I1]]] : memref<2xf32>
// CHECK-NEXT:    scan.linear_recurrence %c0 to %c8 step %c1 state(%[[S]] : memref<2xf32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index):
// CHECK-NEXT:      %[[NA:.*]] = arith.negf %a1 : f32
// CHECK-NEXT:      %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:      %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:      %[[XV:.*]] = memref.load %x[%[[T]]] : memref<8xf32>
// CHECK-NEXT:      %[[BX1:.*]] = arith.mulf %b1, %[[XV]] : f32
// CHECK-NEXT:      %[[BX0:.*]] = arith.mulf %b0, %[[XV]] : f32
// CHECK-NEXT:      %[[P:.*]] = arith.mulf %[[BX0]], %a1 : f32
// CHECK-NEXT:      %[[V0:.*]] = arith.subf %[[BX1]], %[[P]] : f32
// CHECK-NEXT:      scan.yield %[[NA]], %[[ZERO]], %[[ONE]], %[[ZERO]], %[[V0]], %[[BX0]] : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%{{.*}}: index, %[[ST:.*]]: memref<2xf32>):
// CHECK-NEXT:      %[[I:.*]] = arith.constant 1 : index
// CHECK-NEXT:      %[[YV:.*]] = memref.load %[[ST]][%[[I]]] : memref<2xf32>
// CHECK-NEXT:      memref.store %[[YV]], %y[%{{.*}}] : memref<8xf32>
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }
// CHECK:         %[[R:.*]] = memref.load %[[S]][%{{.*}}] : memref<2xf32>
// CHECK:         func.return %[[R]] : f32
