// RUN: xdsl-opt %s -p scan-to-cpu | filecheck %s
// Time innermost: channels in groups of 8 lanes, tiles of 8 rows x 16 steps loaded as
// rows, transposed with shuffles, scanned with an unfused multiply and add per step,
// transposed back and stored. Edges (skew, time remainder, partial group) are masked.

func.func @tiles(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %h0: memref<?xf32>, %h: memref<?x?xf32>, %hT: memref<?xf32>) {
  scan.affine %a, %b init %h0 into %h final %hT axis 1 : memref<?x?xf32>, memref<?x?xf32>, memref<?xf32> -> memref<?x?xf32>, memref<?xf32>
  func.return
}
// CHECK-LABEL: func.func @tiles
// CHECK-NOT:     scan.affine
// Streaming stores only for rows on a cache line (the start and the row stride in
// elements: 64 bytes, 16 f32); rows 32 bytes off a line would write partial lines.
// CHECK:         %[[P:.*]] = "memref.extract_aligned_pointer_as_index"(%h)
// CHECK:         %[[S:.*]] = arith.addi %[[P]], %{{.*}} : index
// CHECK-NEXT:    %[[C64:.*]] = arith.constant 64 : index
// CHECK-NEXT:    %{{.*}} = arith.remui %[[S]], %[[C64]] : index
// CHECK:         %[[C16:.*]] = arith.constant 16 : index
// CHECK-NEXT:    %{{.*}} = arith.remui %{{.*}}, %[[C16]] : index
// CHECK:         %{{.*}} = vector.load %h0[%{{.*}}] : memref<?xf32>, vector<8xf32>
// CHECK:         vector.maskedload %a[%{{.*}}, %{{.*}}], %{{.*}}, %{{.*}} : memref<?x?xf32>, vector<8xi1>, vector<8xf32> into vector<8xf32>
// CHECK:         vector.shuffle %{{.*}}, %{{.*}} [0, 8, 1, 9, 4, 12, 5, 13] : vector<8xf32>, vector<8xf32>
// CHECK:         %[[P:.*]] = arith.mulf %{{.*}}, %{{.*}} : vector<8xf32>
// CHECK-NEXT:    %{{.*}} = arith.addf %[[P]], %{{.*}} : vector<8xf32>
// CHECK:         vector.maskedstore %h[%{{.*}}, %{{.*}}], %{{.*}}, %{{.*}} : memref<?x?xf32>, vector<8xi1>, vector<8xf32>
// The steady loop: plain loads and stores, software prefetch for long rows.
// CHECK:         scf.if
// CHECK:         "memref.prefetch"(%a, %{{.*}}, %{{.*}})
// Its loads: half vectors paired across the two 128-bit lanes (rows g and g+4), so the
// transpose needs only in-lane shuffles.
// CHECK:         %[[LO:.*]] = vector.load %a[%{{.*}}, %{{.*}}] : memref<?x?xf32>, vector<4xf32>
// CHECK-NEXT:    %[[HI:.*]] = vector.load %a[%{{.*}}, %{{.*}}] : memref<?x?xf32>, vector<4xf32>
// CHECK-NEXT:    vector.shuffle %[[LO]], %[[HI]] [0, 1, 2, 3, 4, 5, 6, 7] : vector<4xf32>, vector<4xf32>
// CHECK:         vector.store %{{.*}}, %h[%{{.*}}, %{{.*}}] : memref<?x?xf32>, vector<8xf32>
// CHECK:         vector.store %{{.*}}, %hT[%{{.*}}] : memref<?xf32>, vector<8xf32>
// CHECK-NOT:     math.fma
// CHECK-NOT:     vector.fma

func.func @f64_reverse(%a: memref<?x?xf64>, %b: memref<?x?xf64>, %h: memref<?x?xf64>) {
  scan.affine %a, %b into %h axis 1 reverse : memref<?x?xf64>, memref<?x?xf64> -> memref<?x?xf64>
  func.return
}
// CHECK-LABEL: func.func @f64_reverse
// CHECK:         vector.shuffle %{{.*}}, %{{.*}} [0, 4, 2, 6] : vector<4xf64>, vector<4xf64>
// CHECK:         arith.mulf %{{.*}}, %{{.*}} : vector<4xf64>

func.func @ints(%a: memref<5x?xi32>, %b: memref<5x?xi32>, %h: memref<5x?xi32>) {
  scan.affine %a, %b into %h axis 1 : memref<5x?xi32>, memref<5x?xi32> -> memref<5x?xi32>
  func.return
}
// Integers take two steps per link of the chain: h1 = freeze(a1*a0)*h + (a1*b0 + b1),
// and h0 = a0*h + b0 off the chain (the freeze keeps LLVM from factoring a1 back out).
// CHECK-LABEL: func.func @ints
// CHECK:         %[[A2:.*]] = arith.muli %[[A1:.*]], %[[A0:.*]] : vector<8xi32>
// CHECK-NEXT:    %[[F:.*]] = "llvm.freeze"(%[[A2]]) : (vector<8xi32>) -> vector<8xi32>
// CHECK-NEXT:    %[[AB:.*]] = arith.muli %[[A1]], %[[B0:.*]] : vector<8xi32>
// CHECK-NEXT:    %[[B2:.*]] = arith.addi %[[AB]], %{{.*}} : vector<8xi32>
// CHECK-NEXT:    %[[P0:.*]] = arith.muli %[[A0]], %[[H:.*]] : vector<8xi32>
// CHECK-NEXT:    %{{.*}} = arith.addi %[[P0]], %[[B0]] : vector<8xi32>
// CHECK-NEXT:    %[[P1:.*]] = arith.muli %[[F]], %[[H]] : vector<8xi32>
// CHECK-NEXT:    %[[H1:.*]] = arith.addi %[[P1]], %[[B2]] : vector<8xi32>
// The next pair continues from h1, not from h0.
// CHECK:         "llvm.freeze"
// CHECK:         arith.muli %{{.*}}, %[[H1]] : vector<8xi32>
