func.func @three_d_mid(%a: memref<?x?x?xf32>, %b: memref<?x?x?xf32>, %y: memref<?x?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %zero = arith.constant 0.0 : f32
  %B = memref.dim %a, %c0 : memref<?x?x?xf32>
  %L = memref.dim %a, %c1 : memref<?x?x?xf32>
  %D = memref.dim %a, %c2 : memref<?x?x?xf32>
  scf.for %i = %c0 to %B step %c1 {
    scf.for %d = %c0 to %D step %c1 {
      %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
        %av = memref.load %a[%i, %t, %d] : memref<?x?x?xf32>
        %bv = memref.load %b[%i, %t, %d] : memref<?x?x?xf32>
        %p = arith.mulf %av, %h : f32
        %hn = arith.addf %p, %bv : f32
        memref.store %hn, %y[%i, %t, %d] : memref<?x?x?xf32>
        scf.yield %hn : f32
      }
    }
  }
  func.return
}
