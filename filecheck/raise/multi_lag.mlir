// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// A multi-lag recurrence read from memory (issue 14, form 2):
// y[t] = a1*y[t-1] + a2*y[t-2] + x[t].  The companion state (y[t-1], y[t-2]) is a
// memref<2xf32> temporary initialised from the elements the first step reads; coeffs
// yield the companion matrix [[a1, a2], [1, 0]] and the vector (x[t], 0); emit writes
// the newest element through to y[t].

func.func @iir2(%x: memref<16xf32>, %a1: f32, %a2: f32, %y: memref<16xf32>) {
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c16 = arith.constant 16 : index
  scf.for %t = %c2 to %c16 step %c1 {
    %t1 = arith.subi %t, %c1 : index
    %t2 = arith.subi %t, %c2 : index
    %y1 = memref.load %y[%t1] : memref<16xf32>
    %y2 = memref.load %y[%t2] : memref<16xf32>
    %p1 = arith.mulf %a1, %y1 : f32
    %p2 = arith.mulf %a2, %y2 : f32
    %s = arith.addf %p1, %p2 : f32
    %xv = memref.load %x[%t] : memref<16xf32>
    %yn = arith.addf %s, %xv : f32
    memref.store %yn, %y[%t] : memref<16xf32>
  }
  func.return
}

// CHECK-LABEL: func.func @iir2
// CHECK:         %[[S:.*]] = memref.alloca() : memref<2xf32>
// CHECK-NEXT:    %[[T1:.*]] = arith.subi %c2, %c1 : index
// CHECK-NEXT:    %[[Y1:.*]] = memref.load %y[%[[T1]]] : memref<16xf32>
// CHECK-NEXT:    %[[K0:.*]] = arith.constant 0 : index
// CHECK-NEXT:    memref.store %[[Y1]], %[[S]][%[[K0]]] : memref<2xf32>
// CHECK:         %[[Y2:.*]] = memref.load %y[%{{.*}}] : memref<16xf32>
// CHECK-NEXT:    %[[K1:.*]] = arith.constant 1 : index
// CHECK-NEXT:    memref.store %[[Y2]], %[[S]][%[[K1]]] : memref<2xf32>
// CHECK-NEXT:    scan.linear_recurrence %c2 to %c16 step %c1 state(%[[S]] : memref<2xf32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index):
// CHECK-NEXT:      %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:      %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:      %[[XV:.*]] = memref.load %x[%[[T]]] : memref<16xf32>
// CHECK-NEXT:      scan.yield %a1, %a2, %[[ONE]], %[[ZERO]], %[[XV]], %[[ZERO]] : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[T2:.*]]: index, %[[ST:.*]]: memref<2xf32>):
// CHECK-NEXT:      %[[I0:.*]] = arith.constant 0 : index
// CHECK-NEXT:      %[[YN:.*]] = memref.load %[[ST]][%[[I0]]] : memref<2xf32>
// CHECK-NEXT:      memref.store %[[YN]], %y[%[[T2]]] : memref<16xf32>
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }
