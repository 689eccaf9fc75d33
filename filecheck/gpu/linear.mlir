// RUN: xdsl-opt %s -p scan-to-gpu | filecheck %s
// scan.linear_recurrence (K = 2, the raised 2nd-order IIR filter) -> one fused kernel per
// nest: coeffs cloned per item into (M, v) pairs, identity (I, 0) past the end, folded
// as (M1, v1).(M2, v2) = (M2 M1, M2 v1 + v2), Blelloch up-sweep on pairs in shared
// memory, down-sweep on the state vectors only, replay s = M s + v + emit per step.
// Without a channel loop the state alloca, its setup and the final stores go into one block.

func.func @iir2(%x: memref<3x?xf32>, %c1: memref<3xf32>, %c2: memref<3xf32>, %y: memref<3x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1_i = arith.constant 1 : index
  %c3 = arith.constant 3 : index
  %n = memref.dim %x, %c1_i : memref<3x?xf32>
  scf.for %c = %c0 to %c3 step %c1_i {
    %k1 = memref.load %c1[%c] : memref<3xf32>
    %k2 = memref.load %c2[%c] : memref<3xf32>
    %z = arith.constant 0.0 : f32
    %s = memref.alloca() : memref<2xf32>
    memref.store %z, %s[%c0] : memref<2xf32>
    memref.store %z, %s[%c1_i] : memref<2xf32>
    scan.linear_recurrence %c0 to %n step %c1_i state(%s : memref<2xf32>) coeffs {
    ^bb0(%t: index):
      %one = arith.constant 1.0 : f32
      %zero = arith.constant 0.0 : f32
      %xv = memref.load %x[%c, %t] : memref<3x?xf32>
      scan.yield %k1, %k2, %one, %zero, %xv, %zero : f32, f32, f32, f32, f32, f32
    } emit {
    ^bb0(%t: index, %st: memref<2xf32>):
      %yv = memref.load %st[%c0] : memref<2xf32>
      memref.store %yv, %y[%c, %t] : memref<3x?xf32>
      scan.yield
    }
  }
  func.return
}

func.func @iir2_single(%x: memref<?xi32>, %k: memref<2xi32>, %y: memref<?xi32>, %last: memref<2xi32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = memref.dim %x, %c0 : memref<?xi32>
  %k1 = memref.load %k[%c0] : memref<2xi32>
  %k2 = memref.load %k[%c1] : memref<2xi32>
  %z = arith.constant 0 : i32
  %s = memref.alloca() : memref<2xi32>
  memref.store %z, %s[%c0] : memref<2xi32>
  memref.store %z, %s[%c1] : memref<2xi32>
  scan.linear_recurrence %c0 to %n step %c1 state(%s : memref<2xi32>) coeffs {
  ^bb0(%t: index):
    %one = arith.constant 1 : i32
    %xv = memref.load %x[%t] : memref<?xi32>
    scan.yield %k1, %k2, %one, %z, %xv, %z : i32, i32, i32, i32, i32, i32
  } emit {
  ^bb0(%t: index, %st: memref<2xi32>):
    %yv = memref.load %st[%c0] : memref<2xi32>
    memref.store %yv, %y[%t] : memref<?xi32>
    scan.yield
  }
  %r1 = memref.load %s[%c0] : memref<2xi32>
  %r2 = memref.load %s[%c1] : memref<2xi32>
  memref.store %r1, %last[%c0] : memref<2xi32>
  memref.store %r2, %last[%c1] : memref<2xi32>
  func.return
}

// CHECK:       builtin.module attributes {gpu.container_module} {
// CHECK:         func.func @iir2
// CHECK-DAG:       %[[C3:[0-9]+]] = arith.constant 3 : index
// CHECK-DAG:       %[[C1:[0-9]+]] = arith.constant 1 : index
// CHECK-DAG:       %[[C128:[0-9]+]] = arith.constant 128 : index
// CHECK:           "gpu.launch_func"(%[[C3]], %[[C1]], %[[C1]], %[[C128]], %[[C1]], %[[C1]], %x, %c1, %c2, %y) <{kernel = @scanweaver_kernels::@scan_linear_0
// CHECK-NEXT:      func.return
// CHECK:         func.func @iir2_single
// CHECK-NOT:       memref.alloca
// CHECK:           "gpu.launch_func"(%[[ONE:.*]], %[[ONE]], %[[ONE]], %{{.*}}, %[[ONE]], %[[ONE]], %x, %k, %y, %last) <{kernel = @scanweaver_kernels::@scan_linear_1
// CHECK-NEXT:      func.return
// CHECK:         "gpu.module"() <{sym_name = "scanweaver_kernels"}> ({
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_linear_0_sM", type = memref<512xf32, 3 : i64>
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_linear_0_sV", type = memref<256xf32, 3 : i64>
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_linear_0_sC", type = memref<2xf32, 3 : i64>
// CHECK-NEXT:      "gpu.func"() <{function_type = (memref<3x?xf32>, memref<3xf32>, memref<3xf32>, memref<3x?xf32>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%x: memref<3x?xf32>, %c1: memref<3xf32>, %c2: memref<3xf32>, %y: memref<3x?xf32>):
// CHECK-NEXT:        %[[TID:.*]] = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK-NEXT:        %[[BID:.*]] = "gpu.block_id"() <{dimension = #gpu<dim x>}> : () -> index
//                    every thread: the cloned prologue of the channel iteration (private state)
// CHECK:             %[[K1:.*]] = memref.load %c1[%[[BID]]] : memref<3xf32>
// CHECK-NEXT:        %[[K2:.*]] = memref.load %c2[%[[BID]]] : memref<3xf32>
// CHECK:             %[[S:.*]] = memref.alloca() : memref<2xf32>
// CHECK:             %[[SM:.*]] = memref.get_global @scan_linear_0_sM
// CHECK-NEXT:        %[[SV:.*]] = memref.get_global @scan_linear_0_sV
// CHECK-NEXT:        %[[SC:.*]] = memref.get_global @scan_linear_0_sC
//                    thread 0: initial state -> carry
// CHECK-NEXT:        %{{.*}} = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK-NEXT:        scf.if %{{.*}} {
// CHECK-NEXT:          %[[I0:.*]] = memref.load %[[S]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:          memref.store %[[I0]], %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK:             scf.for
//                      item 0: the coeffs clone, or the identity pair past the end
// CHECK:               %[[IN0:.*]] = arith.cmpi ult, %[[T0:.*]], %n : index
// CHECK-NEXT:          %[[A00:.*]], %[[A01:.*]], %[[A10:.*]], %[[A11:.*]], %[[AV0:.*]], %[[AV1:.*]] = scf.if %[[IN0]] -> (f32, f32, f32, f32, f32, f32) {
// CHECK-NEXT:            %[[XV:.*]] = memref.load %x[%[[BID]], %[[T0]]] : memref<3x?xf32>
// CHECK-NEXT:            scf.yield %[[K1]], %[[K2]], %one, %zero, %[[XV]], %zero : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:          } else {
// CHECK-NEXT:            scf.yield %[[ONEF:.*]], %[[ZEROF:.*]], %[[ZEROF]], %[[ONEF]], %[[ZEROF]], %[[ZEROF]] : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:          }
//                      fold item 1 into item 0: M = M1 M0 (row 0, col 0 first), v = M1 v0 + v1
// CHECK:               %[[B00:.*]], %[[B01:.*]], %[[B10:.*]], %[[B11:.*]], %[[BV0:.*]], %[[BV1:.*]] = scf.if
// CHECK:               %[[P0:.*]] = arith.mulf %[[B00]], %[[A00]] : f32
// CHECK-NEXT:          %[[P1:.*]] = arith.mulf %[[B01]], %[[A10]] : f32
// CHECK-NEXT:          %{{.*}} = arith.addf %[[P0]], %[[P1]] : f32
// CHECK:               %[[Q0:.*]] = arith.mulf %[[B00]], %[[AV0]] : f32
// CHECK-NEXT:          %[[Q1:.*]] = arith.mulf %[[B01]], %[[AV1]] : f32
// CHECK-NEXT:          %[[Q2:.*]] = arith.addf %[[Q0]], %[[Q1]] : f32
// CHECK-NEXT:          %{{.*}} = arith.addf %[[Q2]], %[[BV0]] : f32
//                      the thread aggregate, component-major in shared memory
// CHECK:               memref.store %{{.*}}, %[[SM]][%[[TID]]] : memref<512xf32, 3 : i64>
// CHECK-COUNT-3:       memref.store %{{.*}}, %[[SM]][%{{.*}}] : memref<512xf32, 3 : i64>
// CHECK:               memref.store %{{.*}}, %[[SV]][%[[TID]]] : memref<256xf32, 3 : i64>
// CHECK:               memref.store %{{.*}}, %[[SV]][%{{.*}}] : memref<256xf32, 3 : i64>
//                      up-sweep: 7 levels of pair compositions
// CHECK-COUNT-7:       "gpu.barrier"() : () -> ()
//                      thread 0 flags roots that are not finite (in the root's unused M slot) and
//                      seeds the roots' vectors with the carried state
// CHECK:               %[[SEEDC:.*]] = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[SEEDC]] {
// CHECK-COUNT-6:         memref.load
// CHECK:                 %[[FLAGV:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK-NEXT:            memref.store %[[FLAGV]], %[[SM]][%[[ROOT:.*]]] : memref<512xf32, 3 : i64>
// CHECK-NEXT:            %[[CS0:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:            memref.store %[[CS0]], %[[SV]][%{{.*}}] : memref<256xf32, 3 : i64>
// CHECK-NEXT:            %[[CS1:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:            memref.store %[[CS1]], %[[SV]][%{{.*}}] : memref<256xf32, 3 : i64>
// CHECK-NEXT:          }
//                      down-sweep on state vectors: left <- parent; node <- M_left parent + v_left;
//                      every thread reads the flag after the first barrier
// CHECK-NEXT:          "gpu.barrier"() : () -> ()
// CHECK-NEXT:          %[[FL:.*]] = memref.load %[[SM]][%[[ROOT]]] : memref<512xf32, 3 : i64>
// CHECK-NEXT:          %[[BAD:.*]] = arith.cmpf oeq, %[[FL]], %{{.*}} : f32
// CHECK:                 %[[HP0:.*]] = memref.load %[[SV]][%[[NODE:.*]]] : memref<256xf32, 3 : i64>
// CHECK:                 %[[HP1:.*]] = memref.load %[[SV]][%{{.*}}] : memref<256xf32, 3 : i64>
// CHECK-NEXT:            %[[ML00:.*]] = memref.load %[[SM]][%[[LEFT:.*]]] : memref<512xf32, 3 : i64>
// CHECK:                 %[[ML01:.*]] = memref.load %[[SM]][%{{.*}}] : memref<512xf32, 3 : i64>
// CHECK:                 %[[VL0:.*]] = memref.load %[[SV]][%[[LEFT]]] : memref<256xf32, 3 : i64>
// CHECK:                 memref.store %[[HP0]], %[[SV]][%[[LEFT]]] : memref<256xf32, 3 : i64>
// CHECK:                 memref.store %[[HP1]], %[[SV]][%{{.*}}] : memref<256xf32, 3 : i64>
// CHECK-NEXT:            %[[D0:.*]] = arith.mulf %[[ML00]], %[[HP0]] : f32
// CHECK-NEXT:            %[[D1:.*]] = arith.mulf %[[ML01]], %[[HP1]] : f32
// CHECK-NEXT:            %[[D2:.*]] = arith.addf %[[D0]], %[[D1]] : f32
// CHECK-NEXT:            %[[D3:.*]] = arith.addf %[[D2]], %[[VL0]] : f32
// CHECK:                 memref.store %[[D3]], %[[SV]][%[[NODE]]] : memref<256xf32, 3 : i64>
// CHECK-COUNT-7:       "gpu.barrier"() : () -> ()
//                      replay from the exclusive prefix state, then the cloned emit
// CHECK-NEXT:          %[[H0:.*]] = memref.load %[[SV]][%[[TID]]] : memref<256xf32, 3 : i64>
// CHECK-NEXT:          %{{.*}} = arith.addi %[[TID]], %{{.*}} : index
// CHECK-NEXT:          %[[H1:.*]] = memref.load %[[SV]][%{{.*}}] : memref<256xf32, 3 : i64>
//                      a flagged tile: entering states in the loop's order, one thread after the other
// CHECK-NEXT:          %[[G0:.*]], %[[G1:.*]] = scf.if %[[BAD]] -> (f32, f32) {
// CHECK-NEXT:            scf.for
// CHECK-NEXT:              "gpu.barrier"() : () -> ()
// CHECK:                 scf.yield %[[H0]], %[[H1]] : f32, f32
// CHECK-NEXT:          }
// CHECK-NEXT:          %{{.*}}, %{{.*}} = scf.if %[[IN0]] -> (f32, f32) {
// CHECK-NEXT:            %[[R0:.*]] = arith.mulf %[[A00]], %[[G0]] : f32
// CHECK-NEXT:            %[[R1:.*]] = arith.mulf %[[A01]], %[[G1]] : f32
// CHECK-NEXT:            %[[R2:.*]] = arith.addf %[[R0]], %[[R1]] : f32
// CHECK-NEXT:            %[[NEW0:.*]] = arith.addf %[[R2]], %[[AV0]] : f32
// CHECK:                 memref.store %[[NEW0]], %[[S]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            memref.store %{{.*}}, %[[S]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            %[[YV:.*]] = memref.load %[[S]][%c0] : memref<2xf32>
// CHECK-NEXT:            memref.store %[[YV]], %y[%[[BID]], %[[T0]]] : memref<3x?xf32>
//                      the last thread publishes the state as the next tile's carry
// CHECK:               %[[PUB:.*]] = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[PUB]] {
// CHECK-NEXT:            memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:            memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:          }
// CHECK-NEXT:        }
// CHECK-NEXT:        "gpu.return"() : () -> ()
// CHECK-NEXT:      }) {sym_name = "scan_linear_0", gpu.kernel, scanweaver.launch = {kernel_name = "scan_linear_0", module_name = "scanweaver_kernels", func_name = "iir2", grid = [3 : i64, 1 : i64, 1 : i64], block = [128 : i64, 1 : i64, 1 : i64], shared_bytes = 3080 : i64
//                  depth 0: one block; after the last tile thread 0 writes the final state
// CHECK:           "gpu.func"() <{function_type = (memref<?xi32>, memref<2xi32>, memref<?xi32>, memref<2xi32>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%x: memref<?xi32>, %k: memref<2xi32>, %y: memref<?xi32>, %last: memref<2xi32>):
// CHECK:             %[[K1S:.*]] = memref.load %k[%c0] : memref<2xi32>
// CHECK:             %[[S1:.*]] = memref.alloca() : memref<2xi32>
// CHECK:             %[[SC1:.*]] = memref.get_global @scan_linear_1_sC
// CHECK:             scf.for
//                      the seed (both components) ...
// CHECK:               %[[SEED1:.*]] = memref.load %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:          memref.store %[[SEED1]], %{{.*}} : memref<256xi32, 3 : i64>
// CHECK-NEXT:          %[[SEED2:.*]] = memref.load %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:          memref.store %[[SEED2]], %{{.*}} : memref<256xi32, 3 : i64>
//                    after the tiles: thread 0 copies the carry into the state, runs the epilogue
// CHECK:             %[[F0:.*]] = memref.load %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:        memref.store %[[F0]], %[[S1]][%{{.*}}] : memref<2xi32>
// CHECK:             %r1 = memref.load %[[S1]][%c0] : memref<2xi32>
// CHECK:             memref.store %r1, %last[%c0] : memref<2xi32>
// CHECK:             "gpu.return"() : () -> ()
// CHECK-NEXT:      }) {sym_name = "scan_linear_1", gpu.kernel, scanweaver.launch = {kernel_name = "scan_linear_1", module_name = "scanweaver_kernels", func_name = "iir2_single", grid = [1 : i64, 1 : i64, 1 : i64]
// CHECK-SAME:      notes = "scan.linear_recurrence over no channel loop (one block), state 2 x i32
