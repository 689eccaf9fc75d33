func.func @add_then_mul(%x: memref<?x?xf32>, %k: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %s = arith.addf %h, %xv : f32
      %hn = arith.mulf %s, %k : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
