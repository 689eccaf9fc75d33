func.func @cascade_two_loops(%x: memref<?x?xf32>, %k1: f32, %k2: f32, %y1: memref<?x?xf32>, %y2: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r:2 = scf.for %t = %c0 to %L step %c1 iter_args(%h1 = %zero, %h2 = %zero) -> (f32, f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %p1 = arith.mulf %k1, %h1 : f32
      %n1 = arith.addf %p1, %xv : f32
      %p2 = arith.mulf %k2, %h2 : f32
      %n2 = arith.addf %p2, %n1 : f32
      memref.store %n2, %y1[%c, %t] : memref<?x?xf32>
      scf.yield %n1, %n2 : f32, f32
    }
    %r3 = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %xv = memref.load %y1[%c, %t] : memref<?x?xf32>
      %hn = arith.addf %h, %xv : f32
      memref.store %hn, %y2[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
