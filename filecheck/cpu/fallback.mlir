// RUN: xdsl-opt %s -p scan-to-cpu | filecheck %s
// No fast path: generic scans, rank-1 affine (one chain), and f16 inputs widening to f32
// take the sequential lowering of scan-to-loops.

func.func @generic(%x: memref<4x8xf32>, %y: memref<4x8xf32>) {
  scan.scan ins(%x : memref<4x8xf32>) outs(%y : memref<4x8xf32>) axis 1 {
  ^bb0(%p: f32, %q: f32):
    %m = arith.maximumf %p, %q : f32
    scan.yield %m : f32
  }
  func.return
}
// CHECK-LABEL: func.func @generic
// CHECK-NOT:     vector.
// CHECK:         scf.for
// CHECK:         arith.maximumf %{{.*}}, %{{.*}} : f32

func.func @one_chain(%a: memref<?xf32>, %b: memref<?xf32>, %h: memref<?xf32>) {
  scan.affine %a, %b into %h axis 0 : memref<?xf32>, memref<?xf32> -> memref<?xf32>
  func.return
}
// CHECK-LABEL: func.func @one_chain
// CHECK-NOT:     vector.
// CHECK:         %[[P:.*]] = arith.mulf %{{.*}}, %{{.*}} : f32
// CHECK-NEXT:    arith.addf %[[P]], %{{.*}} : f32

func.func @widen(%a: memref<4x?xf16>, %h: memref<4x?xf32>) {
  scan.affine %a, %a into %h axis 1 : memref<4x?xf16>, memref<4x?xf16> -> memref<4x?xf32>
  func.return
}
// CHECK-LABEL: func.func @widen
// CHECK-NOT:     vector.
// CHECK:         arith.extf %{{.*}} : f16 to f32
