func.func @gae(%r: memref<?x?xf32>, %v: memref<?x?xf32>, %vn: memref<?x?xf32>, %gamma: f32, %lam: f32, %adv: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %r, %c0 : memref<?x?xf32>
  %L = memref.dim %r, %c1 : memref<?x?xf32>
  %Lm1 = arith.subi %L, %c1 : index
  %gl = arith.mulf %gamma, %lam : f32
  scf.for %c = %c0 to %C step %c1 {
    %res = scf.for %i = %c0 to %L step %c1 iter_args(%a = %zero) -> (f32) {
      %t = arith.subi %Lm1, %i : index
      %rv = memref.load %r[%c, %t] : memref<?x?xf32>
      %vv = memref.load %v[%c, %t] : memref<?x?xf32>
      %nv = memref.load %vn[%c, %t] : memref<?x?xf32>
      %g = arith.mulf %gamma, %nv : f32
      %s = arith.addf %rv, %g : f32
      %d = arith.subf %s, %vv : f32
      %p = arith.mulf %gl, %a : f32
      %an = arith.addf %d, %p : f32
      memref.store %an, %adv[%c, %t] : memref<?x?xf32>
      scf.yield %an : f32
    }
  }
  func.return
}
func.func @two_emas(%x: memref<?x?xf32>, %k1: f32, %k2: f32, %y1: memref<?x?xf32>, %y2: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  %m1 = arith.subf %one, %k1 : f32
  %m2 = arith.subf %one, %k2 : f32
  scf.for %c = %c0 to %C step %c1 {
    %r:2 = scf.for %t = %c0 to %L step %c1 iter_args(%h1 = %zero, %h2 = %zero) -> (f32, f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %p1 = arith.mulf %m1, %h1 : f32
      %q1 = arith.mulf %k1, %xv : f32
      %n1 = arith.addf %p1, %q1 : f32
      %p2 = arith.mulf %m2, %h2 : f32
      %q2 = arith.mulf %k2, %xv : f32
      %n2 = arith.addf %p2, %q2 : f32
      memref.store %n1, %y1[%c, %t] : memref<?x?xf32>
      memref.store %n2, %y2[%c, %t] : memref<?x?xf32>
      scf.yield %n1, %n2 : f32, f32
    }
  }
  func.return
}
func.func @ema_f16(%x: memref<?x?xf16>, %alpha: f32, %y: memref<?x?xf16>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf16>
  %L = memref.dim %x, %c1 : memref<?x?xf16>
  %beta = arith.subf %one, %alpha : f32
  scf.for %c = %c0 to %C step %c1 {
    %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %xh = memref.load %x[%c, %t] : memref<?x?xf16>
      %xv = arith.extf %xh : f16 to f32
      %p = arith.mulf %beta, %h : f32
      %q = arith.mulf %alpha, %xv : f32
      %hn = arith.addf %p, %q : f32
      %yh = arith.truncf %hn : f32 to f16
      memref.store %yh, %y[%c, %t] : memref<?x?xf16>
      scf.yield %hn : f32
    }
  }
  func.return
}
func.func @ema_bias(%x: memref<?x?xf32>, %beta: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  %k = arith.subf %one, %beta : f32
  scf.for %c = %c0 to %C step %c1 {
    %r:2 = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero, %p = %one) -> (f32, f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %a = arith.mulf %beta, %h : f32
      %b = arith.mulf %k, %xv : f32
      %hn = arith.addf %a, %b : f32
      %pn = arith.mulf %beta, %p : f32
      %den = arith.subf %one, %pn : f32
      %yv = arith.divf %hn, %den : f32
      memref.store %yv, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn, %pn : f32, f32
    }
  }
  func.return
}
func.func @rglru(%x: memref<?x?xf32>, %r: memref<?x?xf32>, %loga: memref<?xf32>, %cexp: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %one = arith.constant 1.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %la = memref.load %loga[%c] : memref<?xf32>
    %res = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %rv = memref.load %r[%c, %t] : memref<?x?xf32>
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %e1 = arith.mulf %cexp, %rv : f32
      %e2 = arith.mulf %e1, %la : f32
      %at = math.exp %e2 : f32
      %a2 = arith.mulf %at, %at : f32
      %om = arith.subf %one, %a2 : f32
      %sq = math.sqrt %om : f32
      %bx = arith.mulf %sq, %xv : f32
      %ah = arith.mulf %at, %h : f32
      %hn = arith.addf %ah, %bx : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
func.func @reset_thr(%x: memref<?x?xf32>, %thr: f32, %alpha: f32, %y: memref<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0.0 : f32
  %C = memref.dim %x, %c0 : memref<?x?xf32>
  %L = memref.dim %x, %c1 : memref<?x?xf32>
  scf.for %c = %c0 to %C step %c1 {
    %res = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (f32) {
      %xv = memref.load %x[%c, %t] : memref<?x?xf32>
      %big = arith.cmpf ogt, %xv, %thr : f32
      %a = arith.select %big, %zero, %alpha : f32
      %ah = arith.mulf %a, %h : f32
      %hn = arith.addf %ah, %xv : f32
      memref.store %hn, %y[%c, %t] : memref<?x?xf32>
      scf.yield %hn : f32
    }
  }
  func.return
}
func.func @seq_i32_final(%a: memref<?xi32>, %b: memref<?xi32>, %k: i32, %y: memref<?xi32>, %last: memref<1xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %zero = arith.constant 0 : i32
  %L = memref.dim %a, %c0 : memref<?xi32>
  %r = scf.for %t = %c0 to %L step %c1 iter_args(%h = %zero) -> (i32) {
    %av = memref.load %a[%t] : memref<?xi32>
    %bv = memref.load %b[%t] : memref<?xi32>
    %p = arith.muli %av, %h : i32
    %q = arith.muli %k, %bv : i32
    %hn = arith.addi %p, %q : i32
    memref.store %hn, %y[%t] : memref<?xi32>
    scf.yield %hn : i32
  }
  memref.store %r, %last[%c0] : memref<1xi32>
  func.return
}
