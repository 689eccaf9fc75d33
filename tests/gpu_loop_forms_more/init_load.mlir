func.func @init_load(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %h0: memref<?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %C = memref.dim %a, %c0 : memref<?x?xf32>
  %L = memref.dim %a, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %hi = memref.load %h0[%c] : memref<?xf32>
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %hi) -> (f32) {
      %av = memref.load %a[%c, %t] : memref<?x?xf32>
      %bv = memref.load %b[%c, %t] : memref<?x?xf32>
      %p = arith.mulf %av, %h : f32
      %hn = arith.addf %p, %bv : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
