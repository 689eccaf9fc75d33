// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// Masked update (issue 14, form 4): `if mask[t] { h = a[t]*h + x[t] }`.  The scf.if
// condition does not depend on the state, so h' = m ? a*h + x : h; the coefficients
// are computed under the same condition (the loads of a and x stay conditional),
// with the identity step (1, -0.0) when the mask is off.

func.func @masked(%x: memref<8xf32>, %a: memref<8xf32>, %mask: memref<8xi1>, %h0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %r = scf.for %t = %c0 to %c8 step %c1 iter_args(%h = %h0) -> (f32) {
    %m = memref.load %mask[%t] : memref<8xi1>
    %hn = scf.if %m -> (f32) {
      %av = memref.load %a[%t] : memref<8xf32>
      %xv = memref.load %x[%t] : memref<8xf32>
      %p = arith.mulf %av, %h : f32
      %q = arith.addf %p, %xv : f32
      scf.yield %q : f32
    } else {
      scf.yield %h : f32
    }
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK-LABEL: func.func @masked
// CHECK:         scan.recurrence %c0 to %c8 step %c1 state(%{{.*}} : memref<f32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T:.*]]: index):
// CHECK-NEXT:      %[[M:.*]] = memref.load %mask[%[[T]]] : memref<8xi1>
// CHECK-NEXT:      %[[A:.*]] = scf.if %[[M]] -> (f32) {
// CHECK-NEXT:        %[[AV:.*]] = memref.load %a[%[[T]]] : memref<8xf32>
// CHECK-NEXT:        scf.yield %[[AV]] : f32
// CHECK-NEXT:      } else {
// CHECK-NEXT:        %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:        scf.yield %[[ONE]] : f32
// CHECK-NEXT:      }
// CHECK-NEXT:      %[[B:.*]] = scf.if %[[M]] -> (f32) {
// CHECK-NEXT:        %[[XV:.*]] = memref.load %x[%[[T]]] : memref<8xf32>
// CHECK-NEXT:        scf.yield %[[XV]] : f32
// CHECK-NEXT:      } else {
// CHECK-NEXT:        %[[NZ:.*]] = arith.constant -0.000000e+00 : f32
// CHECK-NEXT:        scf.yield %[[NZ]] : f32
// CHECK-NEXT:      }
// CHECK-NEXT:      scan.yield %[[A]], %[[B]] : f32, f32
// CHECK-NEXT:    } emit {

// The mask compared from loaded data, with the coefficients loaded unconditionally:
// a plain select of coefficients.

func.func @masked_select(%x: memref<8xf32>, %a: memref<8xf32>, %h0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %z = arith.constant 0.0 : f32
  %r = scf.for %t = %c0 to %c8 step %c1 iter_args(%h = %h0) -> (f32) {
    %av = memref.load %a[%t] : memref<8xf32>
    %xv = memref.load %x[%t] : memref<8xf32>
    %m = arith.cmpf ogt, %xv, %z : f32
    %hn = scf.if %m -> (f32) {
      %p = arith.mulf %av, %h : f32
      %q = arith.addf %p, %xv : f32
      scf.yield %q : f32
    } else {
      scf.yield %h : f32
    }
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK-LABEL: func.func @masked_select
// CHECK:         coeffs {
// CHECK-NOT:       scf.if
// CHECK:           %[[A2:.*]] = arith.select %{{.*}}, %av, %{{.*}} : f32
// CHECK:           %[[B2:.*]] = arith.select %{{.*}}, %xv, %{{.*}} : f32
// CHECK-NEXT:      scan.yield %[[A2]], %[[B2]] : f32, f32

// math.fma(a, h, x) is a*h + x.

func.func @fma(%x: memref<8xf32>, %a: memref<8xf32>, %h0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %r = scf.for %t = %c0 to %c8 step %c1 iter_args(%h = %h0) -> (f32) {
    %av = memref.load %a[%t] : memref<8xf32>
    %xv = memref.load %x[%t] : memref<8xf32>
    %hn = math.fma %av, %h, %xv : f32
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK-LABEL: func.func @fma
// CHECK:         coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T3:.*]]: index):
// CHECK-NEXT:      %[[AV3:.*]] = memref.load %a[%[[T3]]] : memref<8xf32>
// CHECK-NEXT:      %[[XV3:.*]] = memref.load %x[%[[T3]]] : memref<8xf32>
// CHECK-NEXT:      scan.yield %[[AV3]], %[[XV3]] : f32, f32

// A masked update of a state in memory: `if m[t] { for c { h[c] = a*h[c] + x } }`.
// h is the state; the guard becomes conditional coefficients, as above.

func.func @masked_memory(%x: memref<6x3xf32>, %a: memref<6x3xf32>, %mask: memref<6xi32>, %h: memref<3xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %c6 = arith.constant 6 : index
  %z = arith.constant 0 : i32
  scf.for %t = %c0 to %c6 step %c1 {
    %mv = memref.load %mask[%t] : memref<6xi32>
    %m = arith.cmpi ne, %mv, %z : i32
    scf.if %m {
      scf.for %c = %c0 to %c3 step %c1 {
        %hv = memref.load %h[%c] : memref<3xf32>
        %av = memref.load %a[%t, %c] : memref<6x3xf32>
        %xv = memref.load %x[%t, %c] : memref<6x3xf32>
        %p = arith.mulf %av, %hv : f32
        %q = arith.addf %p, %xv : f32
        memref.store %q, %h[%c] : memref<3xf32>
      }
    }
  }
  func.return
}

// CHECK-LABEL: func.func @masked_memory
// CHECK:         scan.recurrence %c0 to %c6 step %c1 state(%h : memref<3xf32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[T4:.*]]: index, %[[C4:.*]]: index):
// CHECK-NEXT:      %[[MV:.*]] = memref.load %mask[%[[T4]]] : memref<6xi32>
// CHECK-NEXT:      %[[M4:.*]] = arith.cmpi ne, %[[MV]], %z : i32
// CHECK-NEXT:      %[[A4:.*]] = scf.if %[[M4]] -> (f32) {
// CHECK-NEXT:        %[[AV4:.*]] = memref.load %a[%[[T4]], %[[C4]]] : memref<6x3xf32>
// CHECK-NEXT:        scf.yield %[[AV4]] : f32
// CHECK:           %[[B4:.*]] = scf.if %[[M4]] -> (f32) {
// CHECK-NEXT:        %[[XV4:.*]] = memref.load %x[%[[T4]], %[[C4]]] : memref<6x3xf32>
// CHECK:           scan.yield %[[A4]], %[[B4]] : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%{{.*}}: index, %{{.*}}: memref<3xf32>):
// CHECK-NEXT:      scan.yield
