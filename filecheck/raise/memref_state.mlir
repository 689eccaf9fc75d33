// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// State kept in memory at a loop-invariant index (g[c]), discounted return walked in
// reverse.  g is not rank 0, so a rank-0 temporary is the recurrence state: copied in
// before the op, written back to g[c] by emit where the loop stored it.

func.func @discounted(%r: memref<2x4xf32>, %gamma: memref<2xf32>, %g: memref<2xf32>, %G: memref<2x4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c3 = arith.constant 3 : index
  %c4 = arith.constant 4 : index
  scf.for %c = %c0 to %c2 step %c1 {
    %gm = memref.load %gamma[%c] : memref<2xf32>
    scf.for %i = %c0 to %c4 step %c1 {
      %t = arith.subi %c3, %i : index
      %rv = memref.load %r[%c, %t] : memref<2x4xf32>
      %old = memref.load %g[%c] : memref<2xf32>
      %m = arith.mulf %gm, %old : f32
      %new = arith.addf %rv, %m : f32
      memref.store %new, %g[%c] : memref<2xf32>
      memref.store %new, %G[%c, %t] : memref<2x4xf32>
    }
  }
  func.return
}

// CHECK-LABEL: func.func @discounted
// CHECK:         scf.for %c = %c0 to %c2 step %c1 {
// CHECK-NEXT:      %gm = memref.load %gamma[%c] : memref<2xf32>
// CHECK-NEXT:      %[[S:.*]] = memref.alloca() : memref<f32>
// CHECK-NEXT:      %[[G0:.*]] = memref.load %g[%c] : memref<2xf32>
// CHECK-NEXT:      memref.store %[[G0]], %[[S]][] : memref<f32>
// CHECK-NEXT:      scan.recurrence %c0 to %c4 step %c1 state(%[[S]] : memref<f32>) coeffs {
// CHECK-NEXT:      ^{{.*}}(%[[I:.*]]: index):
// CHECK-NEXT:        %[[T:.*]] = arith.subi %c3, %[[I]] : index
// CHECK-NEXT:        %[[RV:.*]] = memref.load %r[%c, %[[T]]] : memref<2x4xf32>
// CHECK-NEXT:        scan.yield %gm, %[[RV]] : f32, f32
// CHECK-NEXT:      } emit {
// CHECK-NEXT:      ^{{.*}}(%[[J:.*]]: index, %[[ST:.*]]: memref<f32>):
// CHECK-NEXT:        %[[T2:.*]] = arith.subi %c3, %[[J]] : index
// CHECK-NEXT:        %[[NEW:.*]] = memref.load %[[ST]][] : memref<f32>
// CHECK-NEXT:        memref.store %[[NEW]], %g[%c] : memref<2xf32>
// CHECK-NEXT:        memref.store %[[NEW]], %G[%c, %[[T2]]] : memref<2x4xf32>
// CHECK-NEXT:        scan.yield
// CHECK-NEXT:      }
// CHECK-NEXT:    }

// A rank-0 state memref is the recurrence state itself: nothing is copied and emit
// keeps only the consumer.

func.func @rank0(%x: memref<5xf64>, %h: memref<f64>, %y: memref<5xf64>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c5 = arith.constant 5 : index
  %half = arith.constant 0.5 : f64
  scf.for %i = %c0 to %c5 step %c1 {
    %xv = memref.load %x[%i] : memref<5xf64>
    %hv = memref.load %h[] : memref<f64>
    %t = arith.addf %hv, %xv : f64
    %hn = arith.mulf %t, %half : f64
    memref.store %hn, %h[] : memref<f64>
    %again = memref.load %h[] : memref<f64>
    memref.store %again, %y[%i] : memref<5xf64>
  }
  func.return
}

// CHECK-LABEL: func.func @rank0
// CHECK-NOT:     memref.alloca
// CHECK:         scan.recurrence %c0 to %c5 step %c1 state(%h : memref<f64>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[I:.*]]: index):
// CHECK-NEXT:      %[[XV:.*]] = memref.load %x[%[[I]]] : memref<5xf64>
// CHECK-NEXT:      %[[B:.*]] = arith.mulf %[[XV]], %half : f64
// CHECK-NEXT:      scan.yield %half, %[[B]] : f64, f64
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[J:.*]]: index, %[[ST:.*]]: memref<f64>):
// CHECK-NEXT:      %[[V:.*]] = memref.load %[[ST]][] : memref<f64>
// CHECK-NEXT:      memref.store %[[V]], %y[%[[J]]] : memref<5xf64>
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return
