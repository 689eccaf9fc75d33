// RUN: xdsl-opt %s -p scan-to-cpu | filecheck %s
// Time axis outermost: channels are contiguous, so no transposes: 4 vectors of 8
// channels per time loop (4 independent chains), then single vectors, then a masked one.

func.func @channels(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %h: memref<?x?xf32>) {
  scan.affine %a, %b into %h axis 0 : memref<?x?xf32>, memref<?x?xf32> -> memref<?x?xf32>
  func.return
}
// CHECK-LABEL: func.func @channels
// CHECK-NOT:     vector.shuffle
// CHECK:         scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}, %{{.*}} = %{{.*}}) -> (vector<8xf32>, vector<8xf32>, vector<8xf32>, vector<8xf32>)
// CHECK:           vector.load %a[%{{.*}}, %{{.*}}] : memref<?x?xf32>, vector<8xf32>
// CHECK:           arith.mulf %{{.*}}, %{{.*}} : vector<8xf32>
// CHECK:         vector.create_mask %{{.*}} : vector<8xi1>
// CHECK:         vector.maskedload %a
// CHECK-NOT:     vector.shuffle
