// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// The state in several terms: h*a + h*c + x  ->  (a + c, x).
func.func @two_terms(%as: memref<4xf32>, %cs: memref<4xf32>, %xs: memref<4xf32>, %h0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%h = %h0) -> (f32) {
    %a = memref.load %as[%i] : memref<4xf32>
    %c = memref.load %cs[%i] : memref<4xf32>
    %x = memref.load %xs[%i] : memref<4xf32>
    %t1 = arith.mulf %h, %a : f32
    %t2 = arith.mulf %h, %c : f32
    %t3 = arith.addf %t1, %t2 : f32
    %hn = arith.addf %t3, %x : f32
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK-LABEL: func.func @two_terms
// CHECK:         scan.recurrence
// CHECK-NEXT:    ^{{.*}}(%[[I:.*]]: index):
// CHECK-NEXT:      %[[A:.*]] = memref.load %as[%[[I]]] : memref<4xf32>
// CHECK-NEXT:      %[[C:.*]] = memref.load %cs[%[[I]]] : memref<4xf32>
// CHECK-NEXT:      %[[AC:.*]] = arith.addf %[[A]], %[[C]] : f32
// CHECK-NEXT:      %[[X:.*]] = memref.load %xs[%[[I]]] : memref<4xf32>
// CHECK-NEXT:      scan.yield %[[AC]], %[[X]] : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}
// CHECK-NEXT:      scan.yield

// Subtraction, negation and division by a state-independent value:
// -(x - h) / k  ->  (1/k, -x/k).
func.func @sub_neg_div(%xs: memref<4xf32>, %h0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %k = arith.constant 4.0 : f32
  %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%h = %h0) -> (f32) {
    %x = memref.load %xs[%i] : memref<4xf32>
    %d = arith.subf %x, %h : f32
    %n = arith.negf %d : f32
    %hn = arith.divf %n, %k : f32
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK-LABEL: func.func @sub_neg_div
// CHECK:         scan.recurrence
// CHECK-NEXT:    ^{{.*}}(%[[I:.*]]: index):
// CHECK-NEXT:      %[[ONE:.*]] = arith.constant 1.000000e+00 : f32
// CHECK-NEXT:      %[[A:.*]] = arith.divf %[[ONE]], %k : f32
// CHECK-NEXT:      %[[X:.*]] = memref.load %xs[%[[I]]] : memref<4xf32>
// CHECK-NEXT:      %[[NX:.*]] = arith.negf %[[X]] : f32
// CHECK-NEXT:      %[[B:.*]] = arith.divf %[[NX]], %k : f32
// CHECK-NEXT:      scan.yield %[[A]], %[[B]] : f32, f32

// A select between two affine forms under a state-independent condition.
func.func @select_forms(%xs: memref<4xi32>, %h0: i32) -> i32 {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c4 = arith.constant 4 : index
  %z = arith.constant 0 : i32
  %r = scf.for %i = %c0 to %c4 step %c1 iter_args(%h = %h0) -> (i32) {
    %x = memref.load %xs[%i] : memref<4xi32>
    %p = arith.cmpi slt, %x, %z : i32
    %t1 = arith.muli %h, %x : i32
    %t2 = arith.addi %h, %x : i32
    %hn = arith.select %p, %t1, %t2 : i32
    scf.yield %hn : i32
  }
  func.return %r : i32
}

// CHECK-LABEL: func.func @select_forms
// CHECK:         scan.recurrence
// CHECK-NEXT:    ^{{.*}}(%[[I:.*]]: index):
// CHECK-NEXT:      %[[X:.*]] = memref.load %xs[%[[I]]] : memref<4xi32>
// CHECK-NEXT:      %[[P:.*]] = arith.cmpi slt, %[[X]], %z : i32
// CHECK-NEXT:      %[[ONE:.*]] = arith.constant 1 : i32
// CHECK-NEXT:      %[[A:.*]] = arith.select %[[P]], %[[X]], %[[ONE]] : i32
// CHECK-NEXT:      %[[ZERO:.*]] = arith.constant 0 : i32
// CHECK-NEXT:      %[[B:.*]] = arith.select %[[P]], %[[ZERO]], %[[X]] : i32
// CHECK-NEXT:      scan.yield %[[A]], %[[B]] : i32, i32
