// RUN: xdsl-opt %s -p scanweaver-raise | filecheck %s

// EMA with the state as a scalar iter_arg: the loop becomes a scan.recurrence on a
// rank-0 alloca; coeffs hold the producer (a, b), emit the consumer (the y store).

func.func @ema(%x: memref<8xf32>, %y: memref<8xf32>, %h0: f32) -> f32 {
  %c0 = arith.constant 0 : index
  %c8 = arith.constant 8 : index
  %c1 = arith.constant 1 : index
  %alpha = arith.constant 0.9 : f32
  %one = arith.constant 1.0 : f32
  %beta = arith.subf %one, %alpha : f32
  %r = scf.for %i = %c0 to %c8 step %c1 iter_args(%h = %h0) -> (f32) {
    %xi = memref.load %x[%i] : memref<8xf32>
    %ah = arith.mulf %alpha, %h : f32
    %bx = arith.mulf %beta, %xi : f32
    %hn = arith.addf %ah, %bx : f32
    memref.store %hn, %y[%i] : memref<8xf32>
    scf.yield %hn : f32
  }
  func.return %r : f32
}

// CHECK-LABEL: func.func @ema
// CHECK-NOT:     scf.for
// CHECK:         %[[S:.*]] = memref.alloca() : memref<f32>
// CHECK-NEXT:    memref.store %h0, %[[S]][] : memref<f32>
// CHECK-NEXT:    scan.recurrence %c0 to %c8 step %c1 state(%[[S]] : memref<f32>) coeffs {
// CHECK-NEXT:    ^{{.*}}(%[[I:.*]]: index):
// CHECK-NEXT:      %[[XI:.*]] = memref.load %x[%[[I]]] : memref<8xf32>
// CHECK-NEXT:      %[[BX:.*]] = arith.mulf %beta, %[[XI]] : f32
// CHECK-NEXT:      scan.yield %alpha, %[[BX]] : f32, f32
// CHECK-NEXT:    } emit {
// CHECK-NEXT:    ^{{.*}}(%[[J:.*]]: index, %[[ST:.*]]: memref<f32>):
// CHECK-NEXT:      %[[HN:.*]] = memref.load %[[ST]][] : memref<f32>
// CHECK-NEXT:      memref.store %[[HN]], %y[%[[J]]] : memref<8xf32>
// CHECK-NEXT:      scan.yield
// CHECK-NEXT:    }
// CHECK-NEXT:    %r = memref.load %[[S]][] : memref<f32>
// CHECK-NEXT:    func.return %r : f32

// Integer cumulative sum, reverse traversal via t = n-1-i: the index arithmetic is
// part of the state-independent slice, cloned into both regions.

func.func @rev_cumsum(%x: memref<6xi32>, %y: memref<6xi32>) -> i32 {
  %c0 = arith.constant 0 : index
  %c5 = arith.constant 5 : index
  %c6 = arith.constant 6 : index
  %c1 = arith.constant 1 : index
  %z = arith.constant 0 : i32
  %r = scf.for %i = %c0 to %c6 step %c1 iter_args(%s = %z) -> (i32) {
    %t = arith.subi %c5, %i : index
    %v = memref.load %x[%t] : memref<6xi32>
    %sn = arith.addi %s, %v : i32
    memref.store %sn, %y[%t] : memref<6xi32>
    scf.yield %sn : i32
  }
  func.return %r : i32
}

// CHECK-LABEL: func.func @rev_cumsum
// CHECK:         memref.alloca() : memref<i32>
// CHECK:         scan.recurrence %c0 to %c6 step %c1
// CHECK:           %[[ONE:.*]] = arith.constant 1 : i32
// CHECK-NEXT:      %[[T:.*]] = arith.subi %c5, %{{.*}} : index
// CHECK-NEXT:      %[[V:.*]] = memref.load %x[%[[T]]] : memref<6xi32>
// CHECK-NEXT:      scan.yield %[[ONE]], %[[V]] : i32, i32
// CHECK-NEXT:    } emit {
// CHECK:           %[[T2:.*]] = arith.subi %c5, %{{.*}} : index
// CHECK:           memref.store %{{.*}}, %y[%[[T2]]] : memref<6xi32>
