func.func @seq_both(%x: memref<?xf32>, %k: f32, %y: memref<?xf32>, %last: memref<1xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %L = memref.dim %x, %c0 : memref<?xf32>
  %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
    %xv = memref.load %x[%t] : memref<?xf32>
    %p = arith.mulf %k, %h : f32
    %hn = arith.addf %p, %xv : f32
    memref.store %hn, %y[%t] : memref<?xf32>
    scf.yield %hn : f32
  }
  %two = arith.constant 2.0 : f32
  %r2 = arith.mulf %r, %two : f32
  memref.store %r2, %last[%c0] : memref<1xf32>
  func.return
}
