// RUN: xdsl-opt %s -p scan-to-gpu | filecheck %s
// A generic scan.scan (argmax over (f32, i32), reverse, dynamic length) becomes one
// chained-tile kernel (128 threads x 4 items): guarded loads -> in-order fold -> warp
// shuffle scan -> warp totals through shared memory -> prefix on the carry -> replay ->
// publish the carry; 2 barriers per tile. No identity: every combine is guarded by
// tests for "empty".

func.func @argmax(%v: memref<8x?xf32>, %i: memref<8x?xi32>, %mv: memref<8x?xf32>, %mi: memref<8x?xi32>) {
  scan.scan ins(%v, %i : memref<8x?xf32>, memref<8x?xi32>) outs(%mv, %mi : memref<8x?xf32>, memref<8x?xi32>) axis 1 reverse {
  ^bb0(%a0: f32, %a1: i32, %b0: f32, %b1: i32):
    %gt = arith.cmpf ogt, %b0, %a0 : f32
    %r0 = arith.select %gt, %b0, %a0 : f32
    %r1 = arith.select %gt, %b1, %a1 : i32
    scan.yield %r0, %r1 : f32, i32
  }
  func.return
}

func.func @cumsum_in_place(%x: memref<1000xi32>) {
  scan.scan ins(%x : memref<1000xi32>) outs(%x : memref<1000xi32>) axis 0 {
  ^bb0(%a: i32, %b: i32):
    %s = arith.addi %a, %b : i32
    scan.yield %s : i32
  }
  func.return
}

// CHECK:       builtin.module attributes {gpu.container_module} {
// CHECK:         func.func @argmax
// CHECK-DAG:       %[[C8:.*]] = arith.constant 8 : index
// CHECK-DAG:       %[[C1:.*]] = arith.constant 1 : index
// CHECK-DAG:       %[[C128:.*]] = arith.constant 128 : index
// CHECK:           "gpu.launch_func"(%[[C8]], %[[C1]], %[[C1]], %[[C128]], %[[C1]], %[[C1]], %v, %i, %mv, %mi) <{kernel = @scanweaver_kernels::@scan_generic_0
// CHECK:         func.func @cumsum_in_place
// CHECK:           "gpu.launch_func"(%{{.*}}, %x) <{kernel = @scanweaver_kernels::@scan_generic_1
// CHECK-NOT:       scan.scan
// CHECK:         "gpu.module"() <{sym_name = "scanweaver_kernels"}> ({
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_generic_0_s0", type = memref<128xf32, 3 : i64>
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_generic_0_s1", type = memref<128xi32, 3 : i64>
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_generic_0_c0", type = memref<1xf32, 3 : i64>
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_generic_0_c1", type = memref<1xi32, 3 : i64>
// CHECK-NEXT:      "gpu.func"() <{function_type = (memref<8x?xf32>, memref<8x?xi32>, memref<8x?xf32>, memref<8x?xi32>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%x0: memref<8x?xf32>, %x1: memref<8x?xi32>, %y0: memref<8x?xf32>, %y1: memref<8x?xi32>):
// CHECK-NEXT:        %[[S0:.*]] = memref.get_global @scan_generic_0_s0
// CHECK-NEXT:        %[[K0:.*]] = memref.get_global @scan_generic_0_c0
// CHECK-NEXT:        %[[S1:.*]] = memref.get_global @scan_generic_0_s1
// CHECK-NEXT:        %[[K1:.*]] = memref.get_global @scan_generic_0_c1
// CHECK-NEXT:        %[[TID:.*]] = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK-NEXT:        %[[BID:.*]] = "gpu.block_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK:             %[[LEN:.*]] = memref.dim %y0, %{{.*}} : memref<8x?xf32>
// CHECK:             scf.for %[[TILE:.*]] = %{{.*}} to %{{.*}} step %{{.*}} {
// CHECK:               %[[CARRY:.*]] = arith.cmpi ugt, %[[TILE]], %{{.*}} : index
//                      registers: guarded loads at the reversed position, zeros past the end
// CHECK:               %[[IN0:.*]] = arith.cmpi ult, %[[T0:.*]], %[[LEN]] : index
// CHECK-NEXT:          %[[V0:.*]], %[[I0:.*]] = scf.if %[[IN0]] -> (f32, i32) {
// CHECK-NEXT:            %[[P0:.*]] = arith.subi %{{.*}}, %[[T0]] : index
// CHECK-NEXT:            %{{.*}} = memref.load %x0[%[[BID]], %[[P0]]] : memref<8x?xf32>
// CHECK-NEXT:            %{{.*}} = memref.load %x1[%[[BID]], %[[P0]]] : memref<8x?xi32>
// CHECK:               } else {
// CHECK-NEXT:            scf.yield %{{.*}}, %{{.*}} : f32, i32
// CHECK:               %[[IN1:.*]] = arith.cmpi ult, %{{.*}}, %[[LEN]] : index
// CHECK-NEXT:          %[[V1:.*]], %[[I1:.*]] = scf.if %[[IN1]] -> (f32, i32) {
//                      in-order fold of the valid items: combine(earlier, later)
// CHECK:               %{{.*}}, %{{.*}} = scf.if %[[IN1]] -> (f32, i32) {
// CHECK-NEXT:            %[[GT:.*]] = arith.cmpf ogt, %[[V1]], %[[V0]] : f32
// CHECK-NEXT:            %{{.*}} = arith.select %[[GT]], %[[V1]], %[[V0]] : f32
// CHECK-NEXT:            %{{.*}} = arith.select %[[GT]], %[[I1]], %[[I0]] : i32
//                      warp scan: Kogge-Stone over 32 lanes, 5 shuffle-up steps per operand,
//                      combining only where this thread holds a valid step (valid steps are a
//                      prefix of the tile, so the lane it reads holds complete ones)
// CHECK:               "gpu.shuffle"(%{{.*}}) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          "gpu.shuffle"(%{{.*}}) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          scf.if %[[IN0]] -> (f32, i32) {
// CHECK-COUNT-4:       "gpu.shuffle"(%{{.*}}) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
//                      the exclusive shift by one lane
// CHECK:               %[[EV:.*]], %[[HASPREV:.*]] = "gpu.shuffle"(%{{.*}}) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[EI:.*]], %{{.*}} = "gpu.shuffle"(%{{.*}}) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
//                      the last lane of each warp posts the warp total; one barrier
// CHECK-NEXT:          %[[L31:.*]] = arith.cmpi eq, %{{.*}}, %{{.*}} : index
// CHECK-NEXT:          scf.if %[[L31]] {
// CHECK-NEXT:            memref.store %{{.*}}, %[[S0]][%[[WARP:.*]]] : memref<128xf32, 3 : i64>
// CHECK-NEXT:            memref.store %{{.*}}, %[[S1]][%[[WARP]]] : memref<128xi32, 3 : i64>
// CHECK-NEXT:          }
// CHECK-NEXT:          "gpu.barrier"() : () -> ()
//                      the carry (tiles after the first), then the totals of the warps before
//                      this one, combine(earlier, later)
// CHECK-NEXT:          %[[CV:.*]] = memref.load %[[K0]][%{{.*}}] : memref<1xf32, 3 : i64>
// CHECK-NEXT:          %[[CI:.*]] = memref.load %[[K1]][%{{.*}}] : memref<1xi32, 3 : i64>
// CHECK-NEXT:          %[[BEFORE:.*]] = arith.cmpi ult, %{{.*}}, %[[WARP]] : index
// CHECK-NEXT:          %[[TV:.*]] = memref.load %[[S0]][%{{.*}}] : memref<128xf32, 3 : i64>
// CHECK-NEXT:          %{{.*}} = memref.load %[[S1]][%{{.*}}] : memref<128xi32, 3 : i64>
// CHECK-NEXT:          %{{.*}}, %{{.*}} = scf.if %[[BEFORE]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}}, %{{.*}} = scf.if %[[CARRY]] -> (f32, i32) {
// CHECK-NEXT:              %{{.*}} = arith.cmpf ogt, %[[TV]], %[[CV]] : f32
// CHECK-COUNT-2:       arith.cmpi ult, %{{.*}}, %[[WARP]] : index
//                      the thread's prefix: the warp's, then the lanes before it in the warp
// CHECK:               %{{.*}}, %{{.*}} = scf.if %[[HASPREV]] -> (f32, i32) {
// CHECK:                 %{{.*}} = arith.cmpf ogt, %[[EV]], %{{.*}} : f32
//                      replay from the prefix (if any), guarded stores
// CHECK:               %{{.*}}, %{{.*}} = scf.if %[[IN0]] -> (f32, i32) {
// CHECK-NEXT:            %[[H0V:.*]], %[[H0I:.*]] = scf.if %[[PVALID:.*]] -> (f32, i32) {
// CHECK-NEXT:              %{{.*}} = arith.cmpf ogt, %[[V0]], %{{.*}} : f32
// CHECK:                 } else {
// CHECK-NEXT:              scf.yield %[[V0]], %[[I0]] : f32, i32
// CHECK:                 memref.store %[[H0V]], %y0[%[[BID]], %{{.*}}] : memref<8x?xf32>
// CHECK-NEXT:            memref.store %[[H0I]], %y1[%[[BID]], %{{.*}}] : memref<8x?xi32>
//                      every thread read the totals and the carry: a barrier before the next
// CHECK:               "gpu.barrier"() : () -> ()
//                      the last thread publishes the carry
// CHECK:               %[[LAST:.*]] = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[LAST]] {
// CHECK-NEXT:            memref.store %{{.*}}, %[[K0]][%{{.*}}] : memref<1xf32, 3 : i64>
// CHECK-NEXT:            memref.store %{{.*}}, %[[K1]][%{{.*}}] : memref<1xi32, 3 : i64>
// CHECK-NEXT:          }
// CHECK-NEXT:        }
// CHECK-NEXT:        "gpu.return"() : () -> ()
// CHECK-NEXT:      }) {sym_name = "scan_generic_0", gpu.kernel, scanweaver.launch = {kernel_name = "scan_generic_0", module_name = "scanweaver_kernels", func_name = "argmax", grid = [8 : i64, 1 : i64, 1 : i64], block = [128 : i64, 1 : i64, 1 : i64], shared_bytes = 1044 : i64
// CHECK-SAME:      args = {{\[}}["x0", "in", "f32", [8 : i64, "?"]], ["x1", "in", "i32", [8 : i64, "?"]], ["y0", "out", "f32", [8 : i64, "?"]], ["y1", "out", "i32", [8 : i64, "?"]]]

// CHECK:           "gpu.func"() <{function_type = (memref<1000xi32>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%x0: memref<1000xi32>):
// CHECK:             memref.load %x0[%{{.*}}] : memref<1000xi32>
// CHECK:             arith.addi
// CHECK:             memref.store %{{.*}}, %x0[%{{.*}}] : memref<1000xi32>
// CHECK:           sym_name = "scan_generic_1"{{.*}}grid = [1 : i64, 1 : i64, 1 : i64]{{.*}}shared_bytes = 516 : i64, args = {{\[}}["x0", "inout", "i32", [1000 : i64]]]
