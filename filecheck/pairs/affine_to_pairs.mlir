// RUN: xdsl-opt %s -p scan-affine-to-pairs | filecheck %s
// scan.affine -> scan.scan over (a, b) pairs with (a1,b1).(a2,b2) = (a1*a2, a2*b1 + b2);
// the initial state is folded into the first pair of the time order.

func.func @reverse_init_final(%a: memref<4x8xf32>, %b: memref<4x8xf32>, %h0: memref<4xf32>, %h: memref<4x8xf32>, %hT: memref<4xf32>) {
  scan.affine %a, %b init %h0 into %h final %hT axis 1 reverse : memref<4x8xf32>, memref<4x8xf32>, memref<4xf32> -> memref<4x8xf32>, memref<4xf32>
  func.return
}
// CHECK-LABEL: func.func @reverse_init_final
// CHECK:         %[[PA:.*]] = memref.alloc() : memref<4x8xf32>
// CHECK-NEXT:    %[[PB:.*]] = memref.alloc() : memref<4x8xf32>
// CHECK-NEXT:    %[[QA:.*]] = memref.alloc() : memref<4x8xf32>
// CHECK:         scf.for
// CHECK:           scf.for
// CHECK:             memref.load %a
// CHECK-NEXT:        memref.store %{{.*}}, %[[PA]]
// CHECK-NEXT:        memref.load %b
// CHECK-NEXT:        memref.store %{{.*}}, %[[PB]]
//                reverse: the first step is the last position, L - 1 = 7
// CHECK:         %[[FIRST:.*]] = arith.subi %{{.*}}, %{{.*}} : index
// CHECK:         scf.if %{{.*}} {
// CHECK-NEXT:      scf.for %[[C:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:        %[[A0:.*]] = memref.load %[[PA]][%[[C]], %[[FIRST]]] : memref<4x8xf32>
// CHECK-NEXT:        %[[I:.*]] = memref.load %h0[%[[C]]] : memref<4xf32>
// CHECK-NEXT:        %[[B0:.*]] = memref.load %[[PB]][%[[C]], %[[FIRST]]] : memref<4x8xf32>
// CHECK-NEXT:        %[[P:.*]] = arith.mulf %[[A0]], %[[I]] : f32
// CHECK-NEXT:        %[[N:.*]] = arith.addf %[[P]], %[[B0]] : f32
// CHECK-NEXT:        memref.store %[[N]], %[[PB]][%[[C]], %[[FIRST]]] : memref<4x8xf32>
// CHECK:         scan.scan ins(%[[PA]], %[[PB]] : memref<4x8xf32>, memref<4x8xf32>) outs(%[[QA]], %h : memref<4x8xf32>, memref<4x8xf32>) axis 1 reverse {
// CHECK-NEXT:    ^{{.*}}(%[[A1:.*]]: f32, %[[B1:.*]]: f32, %[[A2:.*]]: f32, %[[B2:.*]]: f32):
// CHECK-NEXT:      %[[AA:.*]] = arith.mulf %[[A1]], %[[A2]] : f32
// CHECK-NEXT:      %[[AB:.*]] = arith.mulf %[[A2]], %[[B1]] : f32
// CHECK-NEXT:      %[[BB:.*]] = arith.addf %[[AB]], %[[B2]] : f32
// CHECK-NEXT:      scan.yield %[[AA]], %[[BB]] : f32, f32
// CHECK-NEXT:    }
//                final state: h at the last position of the time order (0 when reversed)
// CHECK:         scf.if %{{.*}} {
// CHECK:           memref.load %h[%{{.*}}, %{{.*}}] : memref<4x8xf32>
// CHECK-NEXT:      memref.store %{{.*}}, %hT[%{{.*}}] : memref<4xf32>
// CHECK:         } else {
// CHECK:           memref.load %h0
// CHECK-NEXT:      memref.store %{{.*}}, %hT
// CHECK:         memref.dealloc %[[PA]]
// CHECK-NEXT:    memref.dealloc %[[PB]]
// CHECK-NEXT:    memref.dealloc %[[QA]]

func.func @int_and_widen(%x: memref<16xi32>, %hx: memref<16xi32>, %a: memref<16xf16>, %h: memref<16xf32>) {
  scan.affine %x, %x into %hx axis 0 : memref<16xi32>, memref<16xi32> -> memref<16xi32>
  scan.affine %a, %a into %h axis 0 : memref<16xf16>, memref<16xf16> -> memref<16xf32>
  func.return
}
// CHECK-LABEL: func.func @int_and_widen
// CHECK-NOT:     memref.load %h0
// CHECK:         scan.scan ins(%{{.*}}, %{{.*}} : memref<16xi32>, memref<16xi32>) outs(%{{.*}}, %hx : memref<16xi32>, memref<16xi32>) axis 0 {
// CHECK:           arith.muli
// CHECK-NEXT:      arith.muli
// CHECK-NEXT:      arith.addi
// CHECK:         arith.extf %{{.*}} : f16 to f32
// CHECK:         scan.scan ins(%{{.*}}, %{{.*}} : memref<16xf32>, memref<16xf32>) outs(%{{.*}}, %h : memref<16xf32>, memref<16xf32>) axis 0 {
