// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s
// RUN: xdsl-opt %s -p 'scanweaver-raise{reassociate=true}' | filecheck %s --check-prefix=REASSOC

// Associative, not affine (issue 14): a running maximum becomes a generic scan.scan
// over X = (h0, x[0], x[1], ...): a producer loop fills X, the scan's combine is the
// loop's own update op, and a consumer loop runs the body with the new state P[j+1].

func.func @runmax(%x: memref<?xf32>, %y: memref<?xf32>, %h0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %r = scf.for %t = %c0 to %n step %c1 iter_args(%h = %h0) -> (f32) {
    %xv = memref.load %x[%t] : memref<?xf32>
    %hn = arith.maximumf %h, %xv : f32
    memref.store %hn, %y[%t] : memref<?xf32>
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK-LABEL: func.func @runmax
// CHECK:         %[[X:.*]] = memref.alloc(%[[N1:.*]]) : memref<?xf32>
// CHECK-NEXT:    %[[P:.*]] = memref.alloc(%[[N1]]) : memref<?xf32>
// CHECK-NEXT:    memref.store %h0, %[[X]][%{{.*}}] : memref<?xf32>
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
// CHECK-NEXT:    func.return %[[R]] : f32

// The online log-sum-exp pair (softmax's normaliser) sums floats in its combine:
// left as a loop by default, a two-operand scan.scan with reassociate=true.

func.func @lse(%x: memref<?xf32>, %m0: f32, %s0: f32) -> (f32, f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xf32>
  %r:2 = scf.for %t = %c0 to %n step %c1 iter_args(%m = %m0, %s = %s0) -> (f32, f32) {
    %xv = memref.load %x[%t] : memref<?xf32>
    %mn = arith.maximumf %m, %xv : f32
    %d1 = arith.subf %m, %mn : f32
    %e1 = math.exp %d1 : f32
    %sc = arith.mulf %s, %e1 : f32
    %d2 = arith.subf %xv, %mn : f32
    %e2 = math.exp %d2 : f32
    %sn = arith.addf %sc, %e2 : f32
    scf.yield %mn, %sn : f32, f32
  }
  func.return %r#0, %r#1 : f32, f32
}

// CHECK-LABEL: func.func @lse
// CHECK:         scf.for
// CHECK-NOT:     scan.scan

// REASSOC-LABEL: func.func @lse
// REASSOC:         scan.scan ins(%{{.*}}, %{{.*}} : memref<?xf32>, memref<?xf32>) outs(%{{.*}}, %{{.*}} : memref<?xf32>, memref<?xf32>) axis 0 {
// REASSOC-NEXT:    ^{{.*}}(%[[M1:.*]]: f32, %[[S1:.*]]: f32, %[[M2:.*]]: f32, %[[S2:.*]]: f32):
// REASSOC-NEXT:      %[[BIG:.*]] = arith.maximumf %[[M1]], %[[M2]] : f32
// REASSOC-NEXT:      %[[A:.*]] = arith.subf %[[M1]], %[[BIG]] : f32
// REASSOC-NEXT:      %[[EA:.*]] = math.exp %[[A]] : f32
// REASSOC-NEXT:      %[[B:.*]] = arith.subf %[[M2]], %[[BIG]] : f32
// REASSOC-NEXT:      %[[EB:.*]] = math.exp %[[B]] : f32
// REASSOC-NEXT:      %[[T1:.*]] = arith.mulf %[[S1]], %[[EA]] : f32
// REASSOC-NEXT:      %[[T2:.*]] = arith.mulf %[[S2]], %[[EB]] : f32
// REASSOC-NEXT:      %[[SUM:.*]] = arith.addf %[[T1]], %[[T2]] : f32
// REASSOC-NEXT:      scan.yield %[[BIG]], %[[SUM]] : f32, f32
