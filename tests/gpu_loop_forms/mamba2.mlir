func.func @mamba2(%x: memref<?x?xf32>, %dt: memref<?x?xf32>, %A: memref<?xf32>, %B: memref<?x8xf32>, %C: memref<?x8xf32>, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c8 = arith.constant 8 : index
  %zero = arith.constant 0.0 : f32
  %H = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %hd = %c0 to %H step %c1 {
    %s = memref.alloca() : memref<8xf32>
    scf.for %n = %c0 to %c8 step %c1 {
      memref.store %zero, %s[%n] : memref<8xf32>
    }
    %ah = memref.load %A[%hd] : memref<?xf32>
    scf.for %t = %c0 to %L step %c1 {
      %xv = memref.load %x[%hd, %t] : memref<?x?xf32>
      %dv = memref.load %dt[%hd, %t] : memref<?x?xf32>
      %da = arith.mulf %dv, %ah : f32
      %a = math.exp %da : f32
      %dx = arith.mulf %dv, %xv : f32
      %acc = scf.for %m = %c0 to %c8 step %c1 iter_args(%r = %zero) -> (f32) {
        %sv = memref.load %s[%m] : memref<8xf32>
        %bv = memref.load %B[%t, %m] : memref<?x8xf32>
        %bx = arith.mulf %dx, %bv : f32
        %as = arith.mulf %a, %sv : f32
        %sn = arith.addf %as, %bx : f32
        memref.store %sn, %s[%m] : memref<8xf32>
        %cv = memref.load %C[%t, %m] : memref<?x8xf32>
        %p = arith.mulf %sn, %cv : f32
        %r2 = arith.addf %r, %p : f32
        scf.yield %r2 : f32
      }
      memref.store %acc, %y[%hd, %t] : memref<?x?xf32>
    }
  }
  func.return
}
