// RUN: xdsl-opt %s -p scan-to-loops,canonicalize,cse | filecheck %s
// The sequential lowering: one loop nest over channels, one scf.for over time that
// carries the state, a separate multiply and add per step.

func.func @reverse_init_final(%a: memref<4x?xf32>, %b: memref<4x?xf32>, %h0: memref<4xf32>, %h: memref<4x?xf32>, %hT: memref<4xf32>) {
  scan.affine %a, %b init %h0 into %h final %hT axis 1 reverse : memref<4x?xf32>, memref<4x?xf32>, memref<4xf32> -> memref<4x?xf32>, memref<4xf32>
  func.return
}
// CHECK-LABEL: func.func @reverse_init_final
// CHECK:         %[[LEN:.*]] = memref.dim %h, %{{.*}} : memref<4x?xf32>
// CHECK:         scf.for %[[C:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      %[[H0:.*]] = memref.load %h0[%[[C]]] : memref<4xf32>
// CHECK-NEXT:      %[[LAST:.*]] = scf.for %[[I:.*]] = %{{.*}} to %[[LEN]] step %{{.*}} iter_args(%[[S:.*]] = %[[H0]]) -> (f32) {
// CHECK:             %[[T:.*]] = arith.subi %{{.*}}, %[[I]] : index
// CHECK-NEXT:        %[[A:.*]] = memref.load %a[%[[C]], %[[T]]] : memref<4x?xf32>
// CHECK-NEXT:        %[[B:.*]] = memref.load %b[%[[C]], %[[T]]] : memref<4x?xf32>
// CHECK-NEXT:        %[[P:.*]] = arith.mulf %[[A]], %[[S]] : f32
// CHECK-NEXT:        %[[N:.*]] = arith.addf %[[P]], %[[B]] : f32
// CHECK-NEXT:        memref.store %[[N]], %h[%[[C]], %[[T]]] : memref<4x?xf32>
// CHECK-NEXT:        scf.yield %[[N]] : f32
// CHECK-NEXT:      }
// CHECK-NEXT:      memref.store %[[LAST]], %hT[%[[C]]] : memref<4xf32>

func.func @widen_int(%a: memref<16xbf16>, %h: memref<16xf32>, %x: memref<16xi32>, %hx: memref<16xi32>) {
  scan.affine %a, %a into %h axis 0 : memref<16xbf16>, memref<16xbf16> -> memref<16xf32>
  scan.affine %x, %x into %hx axis 0 : memref<16xi32>, memref<16xi32> -> memref<16xi32>
  func.return
}
// CHECK-LABEL: func.func @widen_int
// CHECK:         arith.extf %{{.*}} : bf16 to f32
// CHECK:         arith.muli %{{.*}}, %{{.*}} : i32
// CHECK-NEXT:    arith.addi %{{.*}}, %{{.*}} : i32

func.func @recurrence(%a: memref<4x128xf32>, %y: memref<128xf32>, %h: memref<4xf32>) {
  %lb = arith.constant 0 : index
  %ub = arith.constant 128 : index
  %c1 = arith.constant 1 : index
  scan.recurrence %lb to %ub step %c1 state(%h : memref<4xf32>) coeffs {
  ^bb0(%i: index, %k: index):
    %av = memref.load %a[%k, %i] : memref<4x128xf32>
    %one = arith.constant 1.0 : f32
    scan.yield %av, %one : f32, f32
  } emit {
  ^bb0(%t: index, %s: memref<4xf32>):
    %c0 = arith.constant 0 : index
    %v = memref.load %s[%c0] : memref<4xf32>
    memref.store %v, %y[%t] : memref<128xf32>
    scan.yield
  }
  func.return
}
// CHECK-LABEL: func.func @recurrence
// CHECK:         scf.for %[[I:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:      scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK-NEXT:        %[[A:.*]] = memref.load %a[%[[K]], %[[I]]] : memref<4x128xf32>
// CHECK-NEXT:        %[[H:.*]] = memref.load %h[%[[K]]] : memref<4xf32>
// CHECK-NEXT:        %[[P:.*]] = arith.mulf %[[A]], %[[H]] : f32
// CHECK-NEXT:        %[[N:.*]] = arith.addf %[[P]], %{{.*}} : f32
// CHECK-NEXT:        memref.store %[[N]], %h[%[[K]]] : memref<4xf32>
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[V:.*]] = memref.load %h[%{{.*}}] : memref<4xf32>
// CHECK-NEXT:      memref.store %[[V]], %y[%[[I]]] : memref<128xf32>
// CHECK-NOT:     scan.
