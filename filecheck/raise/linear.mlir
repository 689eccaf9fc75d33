// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// Second-order IIR y_t = c1*y_{t-1} + c2*y_{t-2} + x_t carried as two coupled
// iter_args (y1, y2) -> (y, y1): a scan.linear_recurrence whose coeffs yield the 2x2
// matrix row-major ([c1, c2], [1, 0]) then the vector (x_t, 0).

func.func @iir2(%x: memref<8xf32>, %y: memref<8xf32>, %c1v: f32, %c2v: f32) -> (f32, f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %z = arith.constant 0.0 : f32
  %r:2 = scf.for %i = %c0 to %c8 step %c1 iter_args(%y1 = %z, %y2 = %z) -> (f32, f32) {
    %a = arith.mulf %c1v, %y1 : f32
    %b = arith.mulf %c2v, %y2 : f32
    %s = arith.addf %a, %b : f32
    %xv = memref.load %x[%i] : memref<8xf32>
    %yn = arith.addf %s, %xv : f32
    memref.store %yn, %y[%i] : memref<8xf32>
    scf.yield %yn, %y1 : f32, f32
  }
  func.return %r#0, %r#1 : f32, f32
}

// CHECK-LABEL: func.func @iir2
// CHECK:         %[[S:.*]] = memref.alloca() : memref<2xf32>
// CHECK-NEXT:    %[[K0:.*]] = arith.constant 0 : index
// CHECK-NEXT:    memref.store %z, %[[S]][%[[K0]]] : memref<2xf32>
// CHECK-NEXT:    %[[K1:.*]] = arith.constant 1 : index
// CHECK-NEXT:    memref.store %z, %[[S]][%[[K1]]] : memref<2xf32>
// CHECK-NEXT:    scan.linear_recurrence %c0 to %c8 step %c1 state(%[[S]] : memref<2xf32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[I:.*]]: index):
// CHECK-NEXT:      %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:      %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:      %[[XV:.*]] = memref.load %x[%[[I]]] : memref<8xf32>
// CHECK-NEXT:      scan.yield %c1v, %c2v, %[[ONE]], %[[ZERO]], %[[XV]], %[[ZERO]] : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[J:.*]]: index, %[[ST:.*]]: memref<2xf32>):
// CHECK-NEXT:      %[[E0:.*]] = arith.constant 0 : index
// CHECK-NEXT:      %[[YN:.*]] = memref.load %[[ST]][%[[E0]]] : memref<2xf32>
// CHECK-NEXT:      memref.store %[[YN]], %y[%[[J]]] : memref<8xf32>
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[R0I:.*]] = arith.constant 0 : index
// CHECK-NEXT:    %[[R0:.*]] = memref.load %[[S]][%[[R0I]]] : memref<2xf32>
// CHECK-NEXT:    %[[R1I:.*]] = arith.constant 1 : index
// CHECK-NEXT:    %[[R1:.*]] = memref.load %[[S]][%[[R1I]]] : memref<2xf32>
// CHECK-NEXT:    func.return %[[R0]], %[[R1]] : f32, f32
