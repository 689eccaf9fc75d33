func.func @affine_emit(%a: memref<?x?xf32>, %x: memref<?x?xf32>, %cc: f32, %dd: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %a, %c0 : memref<?x?xf32>
  %L = memref.dim %a, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %av = memref.load %a[%c, %t] : memref<?x?xf32>
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %p = arith.mulf %av, %h : f32
      %hn = arith.addf %p, %xv : f32
      %ch = arith.mulf %cc, %hn : f32
      %dx = arith.mulf %dd, %xv : f32
      %yv = arith.addf %ch, %dx : f32
      memref.store %yv, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
