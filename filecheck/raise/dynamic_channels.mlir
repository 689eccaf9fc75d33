// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// Time outer, channel inner, with a dynamic channel count (issue 14, form 1).
// %nc = memref.dim %h, 0: the loop covers all of h, so h itself is the state.

func.func @direct(%x: memref<?x?xf32>, %a: memref<?xf32>, %h: memref<?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nt = memref.dim %x, %c0 : memref<?x?xf32>
  %nc = memref.dim %h, %c0 : memref<?xf32>
  scf.for %t = %c0 to %nt step %c1 {
    scf.for %c = %c0 to %nc step %c1 {
      %hv = memref.load %h[%c] : memref<?xf32>
      %av = memref.load %a[%c] : memref<?xf32>
      %xv = memref.load %x[%t, %c] : memref<?x?xf32>
      %m = arith.mulf %av, %hv : f32
      %hn = arith.addf %m, %xv : f32
      memref.store %hn, %h[%c] : memref<?xf32>
      memref.store %hn, %y[%t, %c] : memref<?x?xf32>
    }
  }
  func.return
}

// CHECK-LABEL: func.func @direct
// CHECK-NOT:     memref.alloca
// CHECK:         scan.recurrence %c0 to %nt step %c1 state(%h : memref<?xf32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index, %[[C:.*]]: index):
// CHECK-NEXT:      %[[AV:.*]] = memref.load %a[%[[C]]] : memref<?xf32>
// CHECK-NEXT:      %[[XV:.*]] = memref.load %x[%[[T]], %[[C]]] : memref<?x?xf32>
// CHECK-NEXT:      scan.yield %[[AV]], %[[XV]] : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[T2:.*]]: index, %[[ST:.*]]: memref<?xf32>):
// CHECK-NEXT:      scf.for %[[C2:.*]] = %c0 to %nc step %c1 {
// CHECK-NEXT:        %[[HN:.*]] = memref.load %[[ST]][%[[C2]]] : memref<?xf32>
// CHECK-NEXT:        memref.store %[[HN]], %y[%[[T2]], %[[C2]]] : memref<?x?xf32>
// CHECK-NEXT:      }
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }

// The channel count is x's width, not h's: a memref<?xf32> temporary of that size is
// the state, copied in from h first; emit writes each new element through to h.

func.func @temporary(%x: memref<?x?xf32>, %a: memref<?xf32>, %h: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nt = memref.dim %x, %c0 : memref<?x?xf32>
  %nc = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %t = %c0 to %nt step %c1 {
    scf.for %c = %c0 to %nc step %c1 {
      %hv = memref.load %h[%c] : memref<?xf32>
      %av = memref.load %a[%c] : memref<?xf32>
      %xv = memref.load %x[%t, %c] : memref<?x?xf32>
      %m = arith.mulf %av, %hv : f32
      %hn = arith.addf %m, %xv : f32
      memref.store %hn, %h[%c] : memref<?xf32>
    }
  }
  func.return
}

// CHECK-LABEL: func.func @temporary
// CHECK:         %[[S:.*]] = memref.alloca(%nc) : memref<?xf32>
// CHECK:         scf.for %[[K:.*]] = %{{.*}} to %nc step %{{.*}} {
// CHECK-NEXT:      %[[V:.*]] = memref.load %h[%[[K]]] : memref<?xf32>
// CHECK-NEXT:      memref.store %[[V]], %[[S]][%[[K]]] : memref<?xf32>
// CHECK:         scan.recurrence %c0 to %nt step %c1 state(%[[S]] : memref<?xf32>) coeffs {
// CHECK:         } emit {
// CHECK:           scf.for %[[C3:.*]] = %c0 to %nc step %c1 {
// CHECK-NEXT:        %[[HN2:.*]] = memref.load %{{.*}}[%[[C3]]] : memref<?xf32>
// CHECK-NEXT:        memref.store %[[HN2]], %h[%[[C3]]] : memref<?xf32>
