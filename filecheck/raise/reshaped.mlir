// RUN: xdsl-opt %s -p 'scanweaver-raise{diagnose=true}' 2>&1 | filecheck %s

// Loops the analysis refuses as written, raised after a reshape (raise_reshape.py,
// issue 14): a multi-lag recurrence over channels written time-outer / channel-inner
// has its channel loop moved outside; a state kept at fixed memref locations whose
// previous value escapes the update (lfilter with scipy's zi in memory) is carried as
// iter_args.  When the reshape is not legal the loop keeps its first reason and the
// IR is unchanged.

// CHECK-DAG: @iirc:scf.for#0: scanweaver-raise: loop raised to scan.linear_recurrence (a 2-lag recurrence on its companion state), after moving the channel loop outside the time loop
// CHECK-DAG: @lfm:scf.for#0: scanweaver-raise: loop raised to scan.linear_recurrence (2 coupled carried value(s) and 1 escaping value(s) as extra state), after carrying the state in memory as iter_args
// CHECK-DAG: @escape:scf.for#0: scanweaver-raise: loop raised to scan.linear_recurrence (1 coupled carried value(s) and 1 escaping value(s) as extra state), after carrying the state in memory as iter_args
// CHECK-DAG: @cross:scf.for#0: scanweaver-raise: loop not raised: a multi-lag recurrence inside a channel loop is not supported
// CHECK-DAG: @zi_square:scf.for#0: scanweaver-raise: loop not raised: the state is multiplied by a state-dependent value (arith.mulf h*h) (after carrying the state in memory as iter_args)
// CHECK-DAG: @escc:scf.for#0: scanweaver-raise: loop raised to scan.linear_recurrence (1 coupled carried value(s) and 1 escaping value(s) as extra state), after moving the channel loop outside the time loop and carrying the state in memory as iter_args
// CHECK-DAG: @zi_at_k:scf.for#0: scanweaver-raise: loop not raised: several memref locations carry state

// y[t, c] = a1[c]*y[t-1, c] + a2[c]*y[t-2, c] + x[t, c], channels innermost and dynamic.
// CHECK-LABEL: func.func @iirc
// CHECK:         scf.for %c = %c0 to %nc step %c1 {
// CHECK:           %[[S:.*]] = memref.alloca() : memref<2xf32>
// CHECK:           scan.linear_recurrence %c2 to %nt step %c1 state(%[[S]] : memref<2xf32>) coeffs {
// CHECK-NEXT:      ^{{.*}}(%[[T:.*]]: index):
// CHECK-NEXT:        %[[P1:.*]] = memref.load %a1[%c] : memref<?xf32>
// CHECK-NEXT:        %[[P2:.*]] = memref.load %a2[%c] : memref<?xf32>
// CHECK:             %[[XV:.*]] = memref.load %x[%[[T]], %c] : memref<?x?xf32>
// CHECK-NEXT:        scan.yield %[[P1]], %[[P2]], %{{.*}}, %{{.*}}, %[[XV]], %{{.*}} : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:      } emit {
// CHECK-NEXT:      ^{{.*}}(%[[TE:.*]]: index, %[[ST:.*]]: memref<2xf32>):
// CHECK:             %[[YN:.*]] = memref.load %[[ST]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:        memref.store %[[YN]], %y[%[[TE]], %c] : memref<?x?xf32>
// CHECK:         }
// CHECK-NOT:     scf.for %t
func.func @iirc(%x: memref<?x?xf32>, %a1: memref<?xf32>, %a2: memref<?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %nt = memref.dim %y, %c0 : memref<?x?xf32>
  %nc = memref.dim %y, %c1 : memref<?x?xf32>
  scf.for %t = %c2 to %nt step %c1 {
    %t1 = arith.subi %t, %c1 : index
    %t2 = arith.subi %t, %c2 : index
    scf.for %c = %c0 to %nc step %c1 {
      %p1 = memref.load %a1[%c] : memref<?xf32>
      %p2 = memref.load %a2[%c] : memref<?xf32>
      %y1 = memref.load %y[%t1, %c] : memref<?x?xf32>
      %y2 = memref.load %y[%t2, %c] : memref<?x?xf32>
      %m1 = arith.mulf %p1, %y1 : f32
      %m2 = arith.mulf %p2, %y2 : f32
      %s = arith.addf %m1, %m2 : f32
      %xv = memref.load %x[%t, %c] : memref<?x?xf32>
      %yn = arith.addf %s, %xv : f32
      memref.store %yn, %y[%t, %c] : memref<?x?xf32>
    }
  }
  func.return
}

// Transposed direct form II with its state in z[0], z[1] (scipy.signal.lfilter's zi):
// loaded once before the scan, stored back once after it.
// CHECK-LABEL: func.func @lfm
// CHECK:         %[[Z0:.*]] = memref.load %z[%c0] : memref<2xf32>
// CHECK-NEXT:    %[[Z1:.*]] = memref.load %z[%c1] : memref<2xf32>
// CHECK-NEXT:    %[[S:.*]] = memref.alloca() : memref<3xf32>
// CHECK:         memref.store %[[Z0]], %[[S]][%{{.*}}] : memref<3xf32>
// CHECK:         memref.store %[[Z1]], %[[S]][%{{.*}}] : memref<3xf32>
// CHECK:         scan.linear_recurrence %c0 to %n step %c1 state(%[[S]] : memref<3xf32>) coeffs {
// CHECK:         } emit {
// CHECK:           %[[YV:.*]] = memref.load %{{.*}}[%{{.*}}] : memref<3xf32>
// CHECK-NEXT:      memref.store %[[YV]], %y[%{{.*}}] : memref<?xf32>
// CHECK:         }
// CHECK:         %[[F0:.*]] = memref.load %[[S]][%{{.*}}] : memref<3xf32>
// CHECK:         %[[F1:.*]] = memref.load %[[S]][%{{.*}}] : memref<3xf32>
// CHECK-NEXT:    memref.store %[[F0]], %z[%c0] : memref<2xf32>
// CHECK-NEXT:    memref.store %[[F1]], %z[%c1] : memref<2xf32>
// CHECK-NOT:     scf.for
func.func @lfm(%x: memref<?xf32>, %b: memref<3xf32>, %a: memref<3xf32>, %z: memref<2xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %b0 = memref.load %b[%c0] : memref<3xf32>
  %b1 = memref.load %b[%c1] : memref<3xf32>
  %b2 = memref.load %b[%c2] : memref<3xf32>
  %a1 = memref.load %a[%c1] : memref<3xf32>
  %a2 = memref.load %a[%c2] : memref<3xf32>
  scf.for %t = %c0 to %n step %c1 {
    %xv = memref.load %x[%t] : memref<?xf32>
    %s1 = memref.load %z[%c0] : memref<2xf32>
    %bx0 = arith.mulf %b0, %xv : f32
    %yv = arith.addf %bx0, %s1 : f32
    memref.store %yv, %y[%t] : memref<?xf32>
    %s2 = memref.load %z[%c1] : memref<2xf32>
    %bx1 = arith.mulf %b1, %xv : f32
    %ay1 = arith.mulf %a1, %yv : f32
    %d1 = arith.subf %bx1, %ay1 : f32
    %s1n = arith.addf %d1, %s2 : f32
    memref.store %s1n, %z[%c0] : memref<2xf32>
    %bx2 = arith.mulf %b2, %xv : f32
    %ay2 = arith.mulf %a2, %yv : f32
    %s2n = arith.subf %bx2, %ay2 : f32
    memref.store %s2n, %z[%c1] : memref<2xf32>
  }
  func.return
}

// One location whose previous value escapes (y = x*h stored, h' = y + x).
// CHECK-LABEL: func.func @escape
// CHECK:         %[[H:.*]] = memref.load %h[] : memref<f32>
// CHECK:         scan.linear_recurrence
// CHECK:         memref.store %{{.*}}, %h[] : memref<f32>
// CHECK-NOT:     scf.for
func.func @escape(%x: memref<4xf32>, %y: memref<4xf32>, %h: memref<f32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  scf.for %i = %c0 to %c4 step %c1 {
    %hv = memref.load %h[] : memref<f32>
    %xv = memref.load %x[%i] : memref<4xf32>
    %ah = arith.mulf %xv, %hv : f32
    memref.store %ah, %y[%i] : memref<4xf32>
    %hn = arith.addf %ah, %xv : f32
    memref.store %hn, %h[] : memref<f32>
  }
  func.return
}

// Channel c also reads channel 0's previous value: channels depend on each other, so
// the loops cannot be interchanged.
// CHECK-LABEL: func.func @cross
// CHECK:         scf.for %t
// CHECK-NEXT:      arith.subi
// CHECK-NOT:     scan.
func.func @cross(%x: memref<?x4xf32>, %y: memref<?x4xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %c4 = arith.constant 4 : index
  %nt = memref.dim %y, %c0 : memref<?x4xf32>
  scf.for %t = %c2 to %nt step %c1 {
    %t1 = arith.subi %t, %c1 : index
    %t2 = arith.subi %t, %c2 : index
    scf.for %c = %c0 to %c4 step %c1 {
      %y1 = memref.load %y[%t1, %c] : memref<?x4xf32>
      %y2 = memref.load %y[%t2, %c] : memref<?x4xf32>
      %w = memref.load %y[%t1, %c0] : memref<?x4xf32>
      %s = arith.addf %y1, %y2 : f32
      %xv = memref.load %x[%t, %c] : memref<?x4xf32>
      %xw = arith.mulf %xv, %w : f32
      %yn = arith.addf %s, %xw : f32
      memref.store %yn, %y[%t, %c] : memref<?x4xf32>
    }
  }
  func.return
}

// z[%k], z[%k1] at run-time indices: they may coincide, so they are not promoted.
// CHECK-LABEL: func.func @zi_at_k
// CHECK:         scf.for
// CHECK-NOT:     scan.
func.func @zi_at_k(%x: memref<8xf32>, %z: memref<4xf32>, %k: index, %k1: index) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  scf.for %t = %c0 to %c8 step %c1 {
    %xv = memref.load %x[%t] : memref<8xf32>
    %s1 = memref.load %z[%k] : memref<4xf32>
    %s2 = memref.load %z[%k1] : memref<4xf32>
    %a = arith.addf %s2, %xv : f32
    memref.store %a, %z[%k] : memref<4xf32>
    memref.store %s1, %z[%k1] : memref<4xf32>
  }
  func.return
}

// Promoted, then refused on the reshaped form: that reason is given, and the loop is
// left as written.
// CHECK-LABEL: func.func @zi_square
// CHECK:         scf.for %t
// CHECK-NEXT:      memref.load %x[%t]
// CHECK-NOT:     scan.
func.func @zi_square(%x: memref<8xf32>, %z: memref<2xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  scf.for %t = %c0 to %c8 step %c1 {
    %xv = memref.load %x[%t] : memref<8xf32>
    %s1 = memref.load %z[%c0] : memref<2xf32>
    %s2 = memref.load %z[%c1] : memref<2xf32>
    %sq = arith.mulf %s1, %s2 : f32
    %a = arith.addf %sq, %xv : f32
    memref.store %a, %z[%c0] : memref<2xf32>
    memref.store %s1, %z[%c1] : memref<2xf32>
  }
  func.return
}

// h[c] per channel, time-outer, its previous value escaping to y: both reshapes.  h[c]
// is not known to be in bounds, so it is read and written back only when the time
// loop runs.
// CHECK-LABEL: func.func @escc
// CHECK:         scf.for %c = %c0 to %c3 step %c1 {
// CHECK-NEXT:      %[[NE:.*]] = arith.cmpi slt, %c0, %c6 : index
// CHECK-NEXT:      %[[H0:.*]] = scf.if %[[NE]] -> (f32) {
// CHECK-NEXT:        %[[L:.*]] = memref.load %h[%c] : memref<3xf32>
// CHECK:           scan.linear_recurrence %c0 to %c6 step %c1
// CHECK:           scf.if %[[NE]] {
// CHECK-NEXT:        memref.store %{{.*}}, %h[%c] : memref<3xf32>
func.func @escc(%x: memref<6x3xf32>, %h: memref<3xf32>, %y: memref<6x3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c6 = arith.constant 6 : index
  %half = arith.constant 0.5 : f32
  scf.for %t = %c0 to %c6 step %c1 {
    scf.for %c = %c0 to %c3 step %c1 {
      %hv = memref.load %h[%c] : memref<3xf32>
      %p = arith.mulf %half, %hv : f32
      memref.store %p, %y[%t, %c] : memref<6x3xf32>
      %xv = memref.load %x[%t, %c] : memref<6x3xf32>
      %hn = arith.addf %p, %xv : f32
      memref.store %hn, %h[%c] : memref<3xf32>
    }
  }
  func.return
}
