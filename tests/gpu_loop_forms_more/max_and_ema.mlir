func.func @max_and_ema(%x: memref<?x?xf32>, %k: f32, %y1: memref<?x?xf32>, %y2: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %ninf = arith.constant -1.0e30 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r1 = scf.for %t = %c0 to %L step %c1 iter_args(%m = %ninf) -> (f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %mn = arith.maximumf %m, %xv : f32
      memref.store %mn, %y1[%c, %t] : memref<?x?xf32>
      scf.yield %mn : f32
    }
    %r2 = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %p = arith.mulf %k, %h : f32
      %hn = arith.addf %p, %xv : f32
      memref.store %hn, %y2[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
