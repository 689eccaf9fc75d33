func.func @time_outer(%a: memref<?x?xf32>, %b: memref<?x?xf32>, %h: memref<?xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %L = memref.dim %a, %c0 : memref<?x?xf32>
  %C = memref.dim %a, %c1 : memref<?x?xf32>
  scf.for %t = %c0 to %L step %c1 {
    scf.for %c = %c0 to %C step %c1 {
      %hv = memref.load %h[%c] : memref<?xf32>
      %av = memref.load %a[%t, %c] : memref<?x?xf32>
      %bv = memref.load %b[%t, %c] : memref<?x?xf32>
      %p = arith.mulf %av, %hv : f32
      %hn = arith.addf %p, %bv : f32
      memref.store %hn, %h[%c] : memref<?xf32>
      memref.store %hn, %y[%t, %c] : memref<?x?xf32>
    }
  }
  func.return
}
