// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s
// RUN: xdsl-opt %s -p 'scanweaver-raise{diagnose=true}' 2>&1 | filecheck %s --check-prefix=DIAG

// Associative updates of state kept in memory (issue 14): the promote reshape carries
// m[0] / m[c] as an iter_arg (loaded before the loop, guarded by lb < ub where the
// index is not provably in bounds, stored back after), then the associative raise
// makes it a scan.scan.  Non-associative updates stay refused, the IR unchanged.

func.func @runmax_mem(%x: memref<?xf32>, %m: memref<1xf32>, %y: memref<?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %t = %c0 to %n step %c1 {
    %xv = memref.load %x[%t] : memref<?xf32>
    %old = memref.load %m[%c0] : memref<1xf32>
    %new = arith.maximumf %old, %xv : f32
    memref.store %new, %m[%c0] : memref<1xf32>
    memref.store %new, %y[%t] : memref<?xf32>
  }
  func.return
}

// CHECK-LABEL: func.func @runmax_mem
// CHECK:         %[[H0:.*]] = memref.load %m[%c0] : memref<1xf32>
// CHECK:         %[[X:.*]] = memref.alloc(%[[N1:.*]]) : memref<?xf32>
// CHECK-NEXT:    %[[P:.*]] = memref.alloc(%[[N1]]) : memref<?xf32>
// CHECK-NEXT:    memref.store %[[H0]], %[[X]][%{{.*}}] : memref<?xf32>
// CHECK-NEXT:    scf.for
// CHECK:           %[[XV:.*]] = memref.load %x[%{{.*}}] : memref<?xf32>
// CHECK-NEXT:      memref.store %[[XV]], %[[X]][%{{.*}}] : memref<?xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    scan.scan ins(%[[X]] : memref<?xf32>) outs(%[[P]] : memref<?xf32>) axis 0 {
// CHECK-NEXT:    ^{{.*}}(%[[ACC:.*]]: f32, %[[CUR:.*]]: f32):
// CHECK-NEXT:      %[[M:.*]] = arith.maximumf %[[ACC]], %[[CUR]] : f32
// CHECK-NEXT:      scan.yield %[[M]] : f32
// CHECK-NEXT:    }
// CHECK-NEXT:    scf.for
// CHECK:           %[[HN:.*]] = memref.load %[[P]][%{{.*}}] : memref<?xf32>
// CHECK-NEXT:      memref.store %[[HN]], %y[%{{.*}}] : memref<?xf32>
// CHECK-NEXT:    }
// CHECK-NEXT:    %[[R:.*]] = memref.load %[[P]][%{{.*}}] : memref<?xf32>
// CHECK-NEXT:    memref.dealloc %[[X]] : memref<?xf32>
// CHECK-NEXT:    memref.dealloc %[[P]] : memref<?xf32>
// CHECK-NEXT:    memref.store %[[R]], %m[%c0] : memref<1xf32>
// CHECK-NEXT:    func.return

// DIAG: @runmax_mem:scf.for#0: scanweaver-raise: loop raised to scan.scan (associative arith.maximumf), after carrying the state in memory as iter_args

func.func @runxor_chan(%x: memref<?x?xi32>, %m: memref<?xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %nc = memref.dim %m, %c0 : memref<?xi32>
  %n = memref.dim %x, %c1 : memref<?x?xi32>
  scf.for %c = %c0 to %nc step %c1 {
    scf.for %t = %c0 to %n step %c1 {
      %xv = memref.load %x[%c, %t] : memref<?x?xi32>
      %old = memref.load %m[%c] : memref<?xi32>
      %new = arith.xori %xv, %old : i32
      memref.store %new, %m[%c] : memref<?xi32>
    }
  }
  func.return
}

// m[c] is not provably in bounds: loaded and stored back only when the loop runs.
// CHECK-LABEL: func.func @runxor_chan
// CHECK:         scf.for %c = %c0 to %nc step %c1 {
// CHECK-NEXT:      %[[RUNS:.*]] = arith.cmpi slt, %c0, %n : index
// CHECK-NEXT:      %[[H0:.*]] = scf.if %[[RUNS]] -> (i32) {
// CHECK-NEXT:        %[[L:.*]] = memref.load %m[%c] : memref<?xi32>
// CHECK-NEXT:        scf.yield %[[L]] : i32
// CHECK:           memref.store %[[H0]], %{{.*}}[%{{.*}}] : memref<?xi32>
// CHECK:           scan.scan
// CHECK-NEXT:      ^{{.*}}(%[[A:.*]]: i32, %[[B:.*]]: i32):
// CHECK-NEXT:        %{{.*}} = arith.xori %[[B]], %[[A]] : i32
// CHECK-NOT:       scf.for
// CHECK:           %[[R:.*]] = memref.load %{{.*}}[%{{.*}}] : memref<?xi32>
// CHECK:           scf.if %[[RUNS]] {
// CHECK-NEXT:        memref.store %[[R]], %m[%c] : memref<?xi32>

// DIAG: @runxor_chan:scf.for#1: scanweaver-raise: loop raised to scan.scan (associative arith.xori), after carrying the state in memory as iter_args

func.func @divide_mem(%x: memref<?xi32>, %m: memref<1xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xi32>
  scf.for %t = %c0 to %n step %c1 {
    %xv = memref.load %x[%t] : memref<?xi32>
    %old = memref.load %m[%c0] : memref<1xi32>
    %e = arith.divsi %old, %xv : i32
    %new = arith.maxsi %e, %xv : i32
    memref.store %new, %m[%c0] : memref<1xi32>
  }
  func.return
}

// CHECK-LABEL: func.func @divide_mem
// CHECK-NOT:     scan.
// CHECK:         scf.for %t = %c0 to %n step %c1 {
// CHECK-NEXT:      %xv = memref.load %x[%t] : memref<?xi32>
// CHECK-NEXT:      %old = memref.load %m[%c0] : memref<1xi32>

// DIAG: @divide_mem:scf.for#0: scanweaver-raise: loop not raised: {{.*}}not affine

func.func @maxnum_mem(%x: memref<?xf32>, %m: memref<1xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  scf.for %t = %c0 to %n step %c1 {
    %xv = memref.load %x[%t] : memref<?xf32>
    %old = memref.load %m[%c0] : memref<1xf32>
    %new = arith.maxnumf %old, %xv : f32
    memref.store %new, %m[%c0] : memref<1xf32>
  }
  func.return
}

// CHECK-LABEL: func.func @maxnum_mem
// CHECK-NOT:     scan.
// CHECK:         arith.maxnumf

// DIAG: @maxnum_mem:scf.for#0: scanweaver-raise: loop not raised: arith.maxnumf is associative but not exactly {{.*}}use arith.maximumf / arith.minimumf (after carrying the state in memory as iter_args)
