// RUN: xdsl-opt %s | xdsl-opt | filecheck %s
// Each scan op prints in its custom form and parses back to the same text.

func.func @affine(%a: memref<4x?xf32>, %b: memref<4x?xf32>, %h0: memref<4xf32>, %h: memref<4x?xf32>, %hT: memref<4xf32>) {
  scan.affine %a, %b into %h axis 1 : memref<4x?xf32>, memref<4x?xf32> -> memref<4x?xf32>
  scan.affine %a, %b init %h0 into %h final %hT axis 1 reverse : memref<4x?xf32>, memref<4x?xf32>, memref<4xf32> -> memref<4x?xf32>, memref<4xf32>
  func.return
}
// CHECK-LABEL: func.func @affine
// CHECK-NEXT:    scan.affine %a, %b into %h axis 1 : memref<4x?xf32>, memref<4x?xf32> -> memref<4x?xf32>
// CHECK-NEXT:    scan.affine %a, %b init %h0 into %h final %hT axis 1 reverse : memref<4x?xf32>, memref<4x?xf32>, memref<4xf32> -> memref<4x?xf32>, memref<4xf32>

func.func @mixed(%a: memref<2x8x16xbf16>, %b: memref<2x8x16xbf16>, %h: memref<2x8x16xf32>, %ai: memref<64xi32>, %hi: memref<64xi32>) {
  scan.affine %a, %b into %h axis 2 : memref<2x8x16xbf16>, memref<2x8x16xbf16> -> memref<2x8x16xf32>
  scan.affine %ai, %ai into %hi axis 0 {tag = "exact"} : memref<64xi32>, memref<64xi32> -> memref<64xi32>
  func.return
}
// CHECK-LABEL: func.func @mixed
// CHECK-NEXT:    scan.affine %a, %b into %h axis 2 : memref<2x8x16xbf16>, memref<2x8x16xbf16> -> memref<2x8x16xf32>
// CHECK-NEXT:    scan.affine %ai, %ai into %hi axis 0 {tag = "exact"} : memref<64xi32>, memref<64xi32> -> memref<64xi32>

func.func @pairs(%a: memref<8x64xf32>, %b: memref<8x64xf32>, %pa: memref<8x64xf32>, %pb: memref<8x64xf32>) {
  scan.scan ins(%a, %b : memref<8x64xf32>, memref<8x64xf32>) outs(%pa, %pb : memref<8x64xf32>, memref<8x64xf32>) axis 1 reverse {
  ^bb0(%a1: f32, %b1: f32, %a2: f32, %b2: f32):
    %aa = arith.mulf %a1, %a2 : f32
    %ab = arith.mulf %a2, %b1 : f32
    %bb = arith.addf %ab, %b2 : f32
    scan.yield %aa, %bb : f32, f32
  }
  func.return
}
// CHECK-LABEL: func.func @pairs
// CHECK-NEXT:    scan.scan ins(%a, %b : memref<8x64xf32>, memref<8x64xf32>) outs(%pa, %pb : memref<8x64xf32>, memref<8x64xf32>) axis 1 reverse {
// CHECK-NEXT:    ^bb0(%a1: f32, %b1: f32, %a2: f32, %b2: f32):
// CHECK-NEXT:      %aa = arith.mulf %a1, %a2 : f32
// CHECK:           scan.yield %aa, %bb : f32, f32
// CHECK-NEXT:    }

func.func @fused(%a: memref<4x128xf32>, %y: memref<128xf32>, %h: memref<4xf32>) {
  %lb = arith.constant 0 : index
  %ub = arith.constant 128 : index
  %c1 = arith.constant 1 : index
  scan.recurrence %lb to %ub step %c1 state(%h : memref<4xf32>) attributes {origin = "loop"} coeffs {
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
// CHECK-LABEL: func.func @fused
// CHECK:         scan.recurrence %lb to %ub step %c1 state(%h : memref<4xf32>) attributes {origin = "loop"} coeffs {
// CHECK-NEXT:    ^bb0(%i: index, %k: index):
// CHECK:           scan.yield %av, %one : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^bb0(%t: index, %s: memref<4xf32>):
// CHECK:           scan.yield
// CHECK-NEXT:    }
