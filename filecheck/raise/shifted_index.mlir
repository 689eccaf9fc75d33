// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// State carried through memory at a shifted index: y[c, t] = a[c, t] * y[c, t-1] + x[c, t]
// for t in 1..3.  A rank-0 temporary is the state, initialised from y[c, lb - 1] (the
// element before the first step); emit writes each new state through to y[c, t].

func.func @forward(%a: memref<2x4xf32>, %x: memref<2x4xf32>, %y: memref<2x4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  scf.for %c = %c0 to %c2 step %c1 {
    scf.for %t = %c1 to %c4 step %c1 {
      %tm = arith.subi %t, %c1 : index
      %av = memref.load %a[%c, %t] : memref<2x4xf32>
      %old = memref.load %y[%c, %tm] : memref<2x4xf32>
      %xv = memref.load %x[%c, %t] : memref<2x4xf32>
      %m = arith.mulf %av, %old : f32
      %new = arith.addf %m, %xv : f32
      memref.store %new, %y[%c, %t] : memref<2x4xf32>
    }
  }
  func.return
}

// CHECK-LABEL: func.func @forward
// CHECK:         scf.for %c = %c0 to %c2 step %c1 {
// CHECK-NEXT:      %[[S:.*]] = memref.alloca() : memref<f32>
// CHECK-NEXT:      %[[TM0:.*]] = arith.subi %c1, %c1 : index
// CHECK-NEXT:      %[[Y0:.*]] = memref.load %y[%c, %[[TM0]]] : memref<2x4xf32>
// CHECK-NEXT:      memref.store %[[Y0]], %[[S]][] : memref<f32>
// CHECK-NEXT:      scan.recurrence %c1 to %c4 step %c1 state(%[[S]] : memref<f32>) coeffs {
// CHECK-NEXT:      ^{{.*}}(%[[T:.*]]: index):
// CHECK-NEXT:        %[[AV:.*]] = memref.load %a[%c, %[[T]]] : memref<2x4xf32>
// CHECK-NEXT:        %[[XV:.*]] = memref.load %x[%c, %[[T]]] : memref<2x4xf32>
// CHECK-NEXT:        scan.yield %[[AV]], %[[XV]] : f32, f32
// CHECK-NEXT:      } emit {
// CHECK-NEXT:      ^{{.*}}(%[[T2:.*]]: index, %[[ST:.*]]: memref<f32>):
// CHECK-NEXT:        %[[NEW:.*]] = memref.load %[[ST]][] : memref<f32>
// CHECK-NEXT:        memref.store %[[NEW]], %y[%c, %[[T2]]] : memref<2x4xf32>
// CHECK-NEXT:        scan.yield
// CHECK-NEXT:      }
// CHECK-NEXT:    }

// Reverse walk with a dynamic length: t = n-2-i, g[t] = r[t] + gamma * g[t+1].  The
// initial state g[t(0) + 1] is only read when the loop runs at least one step.

func.func @reverse(%r: memref<?xf32>, %g: memref<?xf32>, %gamma: f32, %n: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %hi = arith.subi %n, %c1 : index
  %nm2 = arith.subi %n, %c2 : index
  scf.for %i = %c0 to %hi step %c1 {
    %t = arith.subi %nm2, %i : index
    %tp = arith.addi %t, %c1 : index
    %rv = memref.load %r[%t] : memref<?xf32>
    %next = memref.load %g[%tp] : memref<?xf32>
    %m = arith.mulf %gamma, %next : f32
    %new = arith.addf %rv, %m : f32
    memref.store %new, %g[%t] : memref<?xf32>
  }
  func.return
}

// CHECK-LABEL: func.func @reverse
// CHECK:         %[[S:.*]] = memref.alloca() : memref<f32>
// CHECK-NEXT:    %[[P:.*]] = arith.cmpi slt, %c0, %hi : index
// CHECK-NEXT:    scf.if %[[P]] {
// CHECK-NEXT:      %[[T0:.*]] = arith.subi %nm2, %c0 : index
// CHECK-NEXT:      %[[TP0:.*]] = arith.addi %[[T0]], %c1 : index
// CHECK-NEXT:      %[[G0:.*]] = memref.load %g[%[[TP0]]] : memref<?xf32>
// CHECK-NEXT:      memref.store %[[G0]], %[[S]][] : memref<f32>
// CHECK-NEXT:    }
// CHECK-NEXT:    scan.recurrence %c0 to %hi step %c1 state(%[[S]] : memref<f32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[I:.*]]: index):
// CHECK-NEXT:      %[[T:.*]] = arith.subi %nm2, %[[I]] : index
// CHECK-NEXT:      %[[RV:.*]] = memref.load %r[%[[T]]] : memref<?xf32>
// CHECK-NEXT:      scan.yield %gamma, %[[RV]] : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[J:.*]]: index, %[[ST:.*]]: memref<f32>):
// CHECK-NEXT:      %[[T2:.*]] = arith.subi %nm2, %[[J]] : index
// CHECK-NEXT:      %[[NEW:.*]] = memref.load %[[ST]][] : memref<f32>
// CHECK-NEXT:      memref.store %[[NEW]], %g[%[[T2]]] : memref<?xf32>
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    func.return

// Loading t+1 while walking forward is not a recurrence over the stored elements.

func.func @wrong_direction(%x: memref<6xf32>, %y: memref<6xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c5 = arith.constant 5 : index
  scf.for %t = %c0 to %c5 step %c1 {
    %tp = arith.addi %t, %c1 : index
    %next = memref.load %y[%tp] : memref<6xf32>
    %xv = memref.load %x[%t] : memref<6xf32>
    %new = arith.addf %next, %xv : f32
    memref.store %new, %y[%t] : memref<6xf32>
  }
  func.return
}

// CHECK-LABEL: func.func @wrong_direction
// CHECK-NOT:     scan.recurrence
// CHECK:         scf.for %t = %c0 to %c5 step %c1 {
