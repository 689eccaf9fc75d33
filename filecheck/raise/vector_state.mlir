// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// A state vector h[n] updated in an inner channel loop, with a reset:
// h[n] = a[t,n] * (done[t] ? 0 : h[n]) + x[t,n].  h has exactly the channel shape, so
// it is the recurrence state; coeffs take (t, n); the select on a state-independent
// condition becomes a select of coefficients.

func.func @reset(%x: memref<4x3xf32>, %a: memref<4x3xf32>, %done: memref<4xi1>, %h: memref<3xf32>, %y: memref<4x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c4 = arith.constant 4 : index
  %zero = arith.constant 0.0 : f32
  scf.for %t = %c0 to %c4 step %c1 {
    %d = memref.load %done[%t] : memref<4xi1>
    scf.for %n = %c0 to %c3 step %c1 {
      %hv = memref.load %h[%n] : memref<3xf32>
      %kept = arith.select %d, %zero, %hv : f32
      %av = memref.load %a[%t, %n] : memref<4x3xf32>
      %m = arith.mulf %av, %kept : f32
      %xv = memref.load %x[%t, %n] : memref<4x3xf32>
      %hn = arith.addf %m, %xv : f32
      memref.store %hn, %h[%n] : memref<3xf32>
      memref.store %hn, %y[%t, %n] : memref<4x3xf32>
    }
  }
  func.return
}

// CHECK-LABEL: func.func @reset
// CHECK-NOT:     memref.alloca
// CHECK:         scan.recurrence %c0 to %c4 step %c1 state(%h : memref<3xf32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index, %[[N:.*]]: index):
// CHECK-NEXT:      %[[D:.*]] = memref.load %done[%[[T]]] : memref<4xi1>
// CHECK-NEXT:      %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK-NEXT:      %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:      %[[SEL:.*]] = arith.select %[[D]], %[[ZERO]], %[[ONE]] : f32
// CHECK-NEXT:      %[[AV:.*]] = memref.load %a[%[[T]], %[[N]]] : memref<4x3xf32>
// CHECK-NEXT:      %[[A:.*]] = arith.mulf %[[SEL]], %[[AV]] : f32
// CHECK-NEXT:      %[[XV:.*]] = memref.load %x[%[[T]], %[[N]]] : memref<4x3xf32>
// CHECK-NEXT:      scan.yield %[[A]], %[[XV]] : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[T2:.*]]: index, %[[ST:.*]]: memref<3xf32>):
// CHECK-NEXT:      scf.for %[[N2:.*]] = %c0 to %c3 step %c1 {
// CHECK-NEXT:        %[[HN:.*]] = memref.load %[[ST]][%[[N2]]] : memref<3xf32>
// CHECK-NEXT:        memref.store %[[HN]], %y[%[[T2]], %[[N2]]] : memref<4x3xf32>
// CHECK-NEXT:      }
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }

// The state is row 1 of a 2x3 memref and a reduction over channels is the output:
// a memref<3xf32> temporary is the state (copied in), emit writes each new element
// back to h[1, n] and keeps the reduction loop.

func.func @row(%x: memref<5x3xf32>, %a: memref<3xf32>, %h: memref<2x3xf32>, %y: memref<5xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c5 = arith.constant 5 : index
  %z = arith.constant 0.0 : f32
  scf.for %t = %c0 to %c5 step %c1 {
    %s = scf.for %n = %c0 to %c3 step %c1 iter_args(%acc = %z) -> (f32) {
      %hv = memref.load %h[%c1, %n] : memref<2x3xf32>
      %av = memref.load %a[%n] : memref<3xf32>
      %xv = memref.load %x[%t, %n] : memref<5x3xf32>
      %m = arith.mulf %av, %hv : f32
      %hn = arith.addf %m, %xv : f32
      memref.store %hn, %h[%c1, %n] : memref<2x3xf32>
      %acc2 = arith.addf %acc, %hn : f32
      scf.yield %acc2 : f32
    }
    memref.store %s, %y[%t] : memref<5xf32>
  }
  func.return
}

// CHECK-LABEL: func.func @row
// CHECK:         %[[S:.*]] = memref.alloca() : memref<3xf32>
// CHECK:         scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      %[[V:.*]] = memref.load %h[%c1, %[[K]]] : memref<2x3xf32>
// CHECK-NEXT:      memref.store %[[V]], %[[S]][%[[K]]] : memref<3xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    scan.recurrence %c0 to %c5 step %c1 state(%[[S]] : memref<3xf32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index, %[[N:.*]]: index):
// CHECK-NEXT:      %[[AV:.*]] = memref.load %a[%[[N]]] : memref<3xf32>
// CHECK-NEXT:      %[[XV:.*]] = memref.load %x[%[[T]], %[[N]]] : memref<5x3xf32>
// CHECK-NEXT:      scan.yield %[[AV]], %[[XV]] : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[T2:.*]]: index, %[[ST:.*]]: memref<3xf32>):
// CHECK-NEXT:      %[[SUM:.*]] = scf.for %[[N2:.*]] = %c0 to %c3 step %c1 iter_args(%[[ACC:.*]] = %z) -> (f32) {
// CHECK-NEXT:        %[[HN:.*]] = memref.load %[[ST]][%[[N2]]] : memref<3xf32>
// CHECK-NEXT:        memref.store %[[HN]], %h[%c1, %[[N2]]] : memref<2x3xf32>
// CHECK-NEXT:        %[[ACC2:.*]] = arith.addf %[[ACC]], %[[HN]] : f32
// CHECK-NEXT:        scf.yield %[[ACC2]] : f32
// CHECK-NEXT:      }
// CHECK-NEXT:      memref.store %[[SUM]], %y[%[[T2]]] : memref<5xf32>
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }
