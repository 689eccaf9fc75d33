// RUN: xdsl-opt %s -p 'scan-to-gpu{block-size=4 items-per-thread=2}' | filecheck %s
// One kernel per scan.affine: registers -> warp-shuffle scan -> exclusive prefix on the
// carry -> replay; chained tiles carry the state in scf.for.

func.func @reverse_init_final(%a: memref<4x?xf32>, %b: memref<4x?xf32>, %h0: memref<4xf32>, %h: memref<4x?xf32>, %hT: memref<4xf32>) {
  scan.affine %a, %b init %h0 into %h final %hT axis 1 reverse : memref<4x?xf32>, memref<4x?xf32>, memref<4xf32> -> memref<4x?xf32>, memref<4xf32>
  func.return
}

// CHECK:       builtin.module attributes {gpu.container_module} {
// CHECK-LABEL:   func.func @reverse_init_final
// CHECK-DAG:       %[[C4:.*]] = arith.constant 4 : index
// CHECK-DAG:       %[[C1:.*]] = arith.constant 1 : index
// CHECK:           "gpu.launch_func"(%[[C4]], %[[C1]], %[[C1]], %[[C4]], %[[C1]], %[[C1]], %a, %b, %h0, %h, %hT) <{kernel = @scanweaver_kernels::@scan_affine_0
// CHECK-NOT:       scan.affine
// CHECK:         "gpu.module"() <{sym_name = "scanweaver_kernels"}> ({
// CHECK-DAG:       "memref.global"() <{sym_name = "scan_affine_0_sA", type = memref<1xf32, 3 : i64>, initial_value
// CHECK-DAG:       "memref.global"() <{sym_name = "scan_affine_0_sB", type = memref<1xf32, 3 : i64>, initial_value
// CHECK-DAG:       "memref.global"() <{sym_name = "scan_affine_0_sC", type = memref<1xf32, 3 : i64>, initial_value
// CHECK:           "gpu.func"() <{function_type = (memref<4x?xf32>, memref<4x?xf32>, memref<4xf32>, memref<4x?xf32>, memref<4xf32>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%a: memref<4x?xf32>, %b: memref<4x?xf32>, %init: memref<4xf32>, %h: memref<4x?xf32>, %final: memref<4xf32>):
// CHECK-NEXT:        %[[TID:.*]] = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK-NEXT:        %[[BID:.*]] = "gpu.block_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK:             %[[LEN:.*]] = memref.dim %h, %{{.*}} : memref<4x?xf32>
// CHECK:             %[[SA:.*]] = memref.get_global @scan_affine_0_sA : memref<1xf32, 3 : i64>
// CHECK-NEXT:        %[[SB:.*]] = memref.get_global @scan_affine_0_sB : memref<1xf32, 3 : i64>
// CHECK-NEXT:        %[[SC:.*]] = memref.get_global @scan_affine_0_sC : memref<1xf32, 3 : i64>
// CHECK-NEXT:        %[[H0:.*]] = memref.load %init[%[[BID]]] : memref<4xf32>
// CHECK:             %[[TOFF:.*]] = arith.muli %[[TID]], %{{.*}} : index
// CHECK-NEXT:        %[[RL:.*]] = arith.subi %[[LEN]], %{{.*}} : index
// CHECK:             %[[LAST:.*]] = scf.for %[[TILE:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[CARRY:.*]] = %[[H0]]) -> (f32) {
//                      the thread's first position, for the stores and for the loads
// CHECK-NEXT:          %[[SB0:.*]] = arith.muli %[[TILE]], %[[TS:.*]] : index
// CHECK-NEXT:          %[[U0:.*]] = arith.addi %[[SB0]], %[[TOFF]] : index
// CHECK-NEXT:          %[[LB0:.*]] = arith.muli %[[TILE]], %[[TS]] : index
// CHECK-NEXT:          %[[T0:.*]] = arith.addi %[[LB0]], %[[TOFF]] : index
//                      registers: guarded loads, identity (1, 0) past the end, reversed index
// CHECK-NEXT:          %[[IN0:.*]] = arith.cmpi ult, %[[T0]], %[[LEN]] : index
// CHECK-NEXT:          %[[A0:.*]], %[[B0:.*]] = scf.if %[[IN0]] -> (f32, f32) {
// CHECK-NEXT:            %[[P0:.*]] = arith.subi %[[RL]], %[[T0]] : index
// CHECK-NEXT:            %{{.*}} = memref.load %a[%[[BID]], %[[P0]]] : memref<4x?xf32>
// CHECK-NEXT:            %{{.*}} = memref.load %b[%[[BID]], %[[P0]]] : memref<4x?xf32>
// CHECK:               } else {
// CHECK-NEXT:            scf.yield %{{.*}}, %{{.*}} : f32, f32
// CHECK:               %[[A1:.*]], %[[B1:.*]] = scf.if
//                      the store guards: which of the thread's positions are in range
// CHECK:               %[[ST0:.*]] = arith.cmpi ult, %[[U0]], %[[LEN]] : index
// CHECK-NEXT:          %[[U1:.*]] = arith.addi %[[U0]], %{{.*}} : index
// CHECK-NEXT:          %[[ST1:.*]] = arith.cmpi ult, %[[U1]], %[[LEN]] : index
//                      thread aggregate (a0, b0) . (a1, b1)
//                      with the underflow poison: a product of non-zero factors below the
//                      smallest normal -> NaN
// CHECK-NEXT:          %[[AGA:.*]] = arith.mulf %[[A0]], %[[A1]] : f32
// CHECK-NEXT:          %[[ABS:.*]] = math.absf %[[AGA]] : f32
// CHECK-NEXT:          %[[SMALL:.*]] = arith.cmpf olt, %[[ABS]], %{{.*}} : f32
// CHECK:               %[[LOST:.*]] = arith.andi %[[SMALL]], %{{.*}} : i1
// CHECK-NEXT:          %[[AGP:.*]] = arith.select %[[LOST]], %{{.*}}, %[[AGA]] : f32
// CHECK-NEXT:          %[[M:.*]] = arith.mulf %[[A1]], %[[B0]] : f32
// CHECK:               %[[MP:.*]] = arith.select %{{.*}}, %{{.*}}, %[[M]] : f32
// CHECK-NEXT:          %[[AGB:.*]] = arith.addf %[[MP]], %[[B1]] : f32
//                      warp scan (Kogge-Stone, one warp of 4 lanes): shuffle up by 1, 2,
//                      combine where valid (same poisoned combine), keep the own value else
// CHECK-NEXT:          %[[SA1:.*]], %[[V1:.*]] = "gpu.shuffle"(%[[AGP]], %[[ONE:.*]], %[[W:.*]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[SB1:.*]], %{{.*}} = "gpu.shuffle"(%[[AGB]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %{{.*}} = arith.mulf %[[SA1]], %[[AGP]] : f32
// CHECK:               %[[CA1:.*]] = arith.select %[[V1]], %{{.*}}, %[[AGP]] : f32
// CHECK-NEXT:          %[[CB1:.*]] = arith.select %[[V1]], %{{.*}}, %[[AGB]] : f32
// CHECK-NEXT:          %{{.*}}, %[[V2:.*]] = "gpu.shuffle"(%[[CA1]], %[[TWO:.*]], %[[W]]) <{mode = #gpu<shuffle_mode up>}>
// CHECK-NEXT:          %{{.*}}, %{{.*}} = "gpu.shuffle"(%[[CB1]], %[[TWO]], %[[W]]) <{mode = #gpu<shuffle_mode up>}>
// CHECK:               %[[IA:.*]] = arith.select %[[V2]], %{{.*}}, %[[CA1]] : f32
// CHECK-NEXT:          %[[IB:.*]] = arith.select %[[V2]], %{{.*}}, %[[CB1]] : f32
//                      exclusive prefix: the previous lane's inclusive pair
// CHECK-NEXT:          %[[EA:.*]], %[[HASPREV:.*]] = "gpu.shuffle"(%[[IA]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}>
// CHECK-NEXT:          %[[EB:.*]], %{{.*}} = "gpu.shuffle"(%[[IB]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}>
//                      overflow verdict: some lane's inclusive pair is not finite (xor butterfly)
// CHECK-NEXT:          %{{.*}} = arith.subf %[[IA]], %[[IA]] : f32
// CHECK:               "gpu.shuffle"(%{{.*}}) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK:               "gpu.shuffle"(%{{.*}}) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[ANY:.*]] = arith.ori %{{.*}}, %{{.*}} : i32
// CHECK-NEXT:          %[[BAD:.*]] = arith.cmpi ne, %[[ANY]], %{{.*}} : i32
//                      a flagged tile: entering states in the loop's order, one thread after the other
// CHECK-NEXT:          %[[PRE:.*]] = scf.if %[[BAD]] -> (f32) {
// CHECK-NEXT:            scf.for %[[J:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%{{.*}} = %{{.*}}) -> (f32) {
// CHECK-NEXT:              "gpu.barrier"() : () -> ()
// CHECK-NEXT:              %{{.*}} = arith.cmpi eq, %[[TID]], %[[J]] : index
// CHECK:                 memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<1xf32, 3 : i64>
//                      otherwise the exclusive prefix applied to the carry (lane 0: the carry)
// CHECK:                 %[[XM:.*]] = arith.mulf %[[EA]], %[[CARRY]] : f32
// CHECK-NEXT:            %[[XA:.*]] = arith.addf %[[XM]], %[[EB]] : f32
// CHECK-NEXT:            %[[TREE:.*]] = arith.select %[[HASPREV]], %[[XA]], %[[CARRY]] : f32
// CHECK-NEXT:            scf.yield %[[TREE]] : f32
// CHECK-NEXT:          }
//                      replay from the exclusive prefix, guarded stores
// CHECK-NEXT:          %[[X0:.*]] = arith.mulf %[[A0]], %[[PRE]] : f32
// CHECK-NEXT:          %[[H_0:.*]] = arith.addf %[[X0]], %[[B0]] : f32
// CHECK-NEXT:          scf.if %[[ST0]] {
// CHECK-NEXT:            %[[R0:.*]] = arith.subi %[[RL]], %[[U0]] : index
// CHECK-NEXT:            memref.store %[[H_0]], %h[%[[BID]], %[[R0]]] : memref<4x?xf32>
// CHECK-NEXT:          }
// CHECK-NEXT:          %[[X1:.*]] = arith.mulf %[[A1]], %[[H_0]] : f32
// CHECK-NEXT:          %[[H_1:.*]] = arith.addf %[[X1]], %[[B1]] : f32
// CHECK-NEXT:          scf.if %[[ST1]] {
// CHECK-NEXT:            %[[R1:.*]] = arith.subi %[[RL]], %[[U1]] : index
// CHECK-NEXT:            memref.store %[[H_1]], %h[%[[BID]], %[[R1]]] : memref<4x?xf32>
// CHECK-NEXT:          }
//                      one warp: the last lane's state is the next carry, no barrier
// CHECK-NEXT:          %[[NEXT:.*]], %{{.*}} = "gpu.shuffle"(%[[H_1]], %{{.*}}, %[[W]]) <{mode = #gpu<shuffle_mode idx>}>
// CHECK-NEXT:          scf.yield %[[NEXT]] : f32
// CHECK:             scf.if %{{.*}} {
// CHECK-NEXT:          memref.store %[[LAST]], %final[%[[BID]]] : memref<4xf32>
// CHECK:             "gpu.return"() : () -> ()
// CHECK:           }) {sym_name = "scan_affine_0", gpu.kernel, scanweaver.launch = {kernel_name = "scan_affine_0", module_name = "scanweaver_kernels", func_name = "reverse_init_final", grid = [4 : i64, 1 : i64, 1 : i64], block = [4 : i64, 1 : i64, 1 : i64], shared_bytes = 4 : i64

// f64 with two items per thread: one 16-byte vector<2xf64> per run in full tiles, only where
// the bases of a, b and h are all 16-byte aligned (one test per kernel; a device view off a
// 16-byte boundary takes the guarded scalar path, loads and stores alike).
func.func @vectors_f64(%a: memref<4x?xf64>, %b: memref<4x?xf64>, %h: memref<4x?xf64>) {
  scan.affine %a, %b into %h axis 1 : memref<4x?xf64>, memref<4x?xf64> -> memref<4x?xf64>
  func.return
}

// CHECK:           "gpu.func"() <{function_type = (memref<4x?xf64>, memref<4x?xf64>, memref<4x?xf64>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%a: memref<4x?xf64>, %b: memref<4x?xf64>, %h: memref<4x?xf64>):
// CHECK-NEXT:        %[[PA:.*]] = "memref.extract_aligned_pointer_as_index"(%a) : (memref<4x?xf64>) -> index
// CHECK-NEXT:        %[[PB:.*]] = "memref.extract_aligned_pointer_as_index"(%b) : (memref<4x?xf64>) -> index
// CHECK-NEXT:        %[[PAB:.*]] = arith.ori %[[PA]], %[[PB]] : index
// CHECK-NEXT:        %[[PH:.*]] = "memref.extract_aligned_pointer_as_index"(%h) : (memref<4x?xf64>) -> index
// CHECK-NEXT:        %[[PALL:.*]] = arith.ori %[[PAB]], %[[PH]] : index
// CHECK-NEXT:        %[[M15:.*]] = arith.constant 15 : index
// CHECK-NEXT:        %[[Z:.*]] = arith.constant 0 : index
// CHECK-NEXT:        %[[LOW:.*]] = arith.andi %[[PALL]], %[[M15]] : index
// CHECK-NEXT:        %[[BASES:.*]] = arith.cmpi eq, %[[LOW]], %[[Z]] : index
// CHECK:             scf.for
// CHECK:               %[[LDV:.*]] = arith.andi %{{.*}}, %[[BASES]] : i1
// CHECK-NEXT:          %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} = scf.if %[[LDV]] -> (f64, f64, f64, f64) {
// CHECK-NEXT:            vector.load %a[%{{.*}}, %{{.*}}] {alignment = 16 : i64} : memref<4x?xf64>, vector<2xf64>
// CHECK:                 vector.load %b[%{{.*}}, %{{.*}}] {alignment = 16 : i64} : memref<4x?xf64>, vector<2xf64>
// CHECK:               } else {
// CHECK-COUNT-2:         memref.load %a[%{{.*}}, %{{.*}}] : memref<4x?xf64>
// CHECK:               %[[STV:.*]] = arith.andi %{{.*}}, %[[BASES]] : i1
// CHECK-NEXT:          scf.if %[[STV]] {
// CHECK:                 vector.store %{{.*}}, %h[%{{.*}}, %{{.*}}] {alignment = 16 : i64} : memref<4x?xf64>, vector<2xf64>
// CHECK-NEXT:          } else {
// CHECK:                 memref.store %{{.*}}, %h[%{{.*}}, %{{.*}}] : memref<4x?xf64>
