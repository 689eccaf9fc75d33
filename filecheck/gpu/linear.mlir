// RUN: xdsl-opt %s -p scan-to-gpu | filecheck %s
// scan.linear_recurrence (K = 2, the raised 2nd-order IIR filter) -> one fused kernel per
// nest: coeffs cloned per item into (M, v) pairs, identity (I, 0) past the end, folded
// as (M1, v1).(M2, v2) = (M2 M1, M2 v1 + v2), a Kogge-Stone warp-shuffle scan of all six
// (M, v) components, the warps' totals through shared memory (one barrier), each thread
// folding the warps before its own onto the register carry, its entering state from the
// previous lane, replay s = M s + v + emit per step, the last thread's state through sC
// (a second barrier). Prefetch: the tile loop carries the next tile's pairs, produced
// (loads included) at the top of each tile, before its shuffles. f32: the overflow guard (xor-butterfly warp flag, NaN-flagged warp
// total, a flagged tile in the loop's order); i32 wraps: no guard.
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
//                  warp totals: 4 M and 2 v components x 4 warps (component-major), the carry
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_linear_0_sM", type = memref<16xf32, 3 : i64>
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_linear_0_sV", type = memref<8xf32, 3 : i64>
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
// CHECK-NEXT:          %[[I1:.*]] = memref.load %[[S]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:          memref.store %[[I1]], %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
//                    lane and warp of the thread; one barrier, then the carry in registers
// CHECK:             %[[LANE:.*]] = arith.remui %[[TID]], %[[C32:.*]] : index
// CHECK-NEXT:        %[[WARP:.*]] = arith.divui %[[TID]], %[[C32]] : index
// CHECK-NEXT:        "gpu.barrier"() : () -> ()
// CHECK-NEXT:        %[[CR0:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:        %[[CR1:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
//                    prefetch: tile 0's pairs before the loop (the coeffs clone, or the
//                    identity pair past the end)
// CHECK-NEXT:        %{{.*}} = arith.muli %{{.*}}, %{{.*}} : index
// CHECK-NEXT:        %[[PT0:.*]] = arith.addi %{{.*}}, %{{.*}} : index
// CHECK-NEXT:        %[[PIN0:.*]] = arith.cmpi ult, %[[PT0]], %n : index
// CHECK:             %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}}, %{{.*}} = scf.if %[[PIN0]] -> (f32, f32, f32, f32, f32, f32) {
// CHECK-NEXT:          %[[PXV:.*]] = memref.load %x[%[[BID]], %[[PT0]]] : memref<3x?xf32>
// CHECK-NEXT:          scf.yield %[[K1]], %[[K2]], %one, %zero, %[[PXV]], %zero : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:        } else {
// CHECK-NEXT:          scf.yield %[[ONEF:.*]], %[[ZEROF:.*]], %[[ZEROF]], %[[ONEF]], %[[ZEROF]], %[[ZEROF]] : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:        }
// CHECK-COUNT-3:     memref.load %x[%[[BID]], %{{.*}}] : memref<3x?xf32>
// CHECK-DAG:         %[[ONE:.*]] = arith.constant 1 : i32
// CHECK-DAG:         %[[W:.*]] = arith.constant 32 : i32
// CHECK-DAG:         %[[O2:.*]] = arith.constant 2 : i32
// CHECK-DAG:         %[[O4:.*]] = arith.constant 4 : i32
// CHECK-DAG:         %[[O8:.*]] = arith.constant 8 : i32
// CHECK-DAG:         %[[O16:.*]] = arith.constant 16 : i32
// CHECK-DAG:         %[[NAN:.*]] = arith.constant 0x7fc00000 : f32
// CHECK-NOT:         "gpu.barrier"
//                    the loop carries the state, then this tile's four (M, v) pairs
// CHECK:             scf.for %[[TL:[0-9a-z_]+]] = %{{.*}} to %{{.*}} step %[[STEP:[0-9a-z_]+]] iter_args(%[[R0:[0-9a-z_]+]] = %[[CR0]], %[[R1:[0-9a-z_]+]] = %[[CR1]], %[[A00:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[A01:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[A10:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[A11:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[AV0:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[AV1:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[B00:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[B01:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[B10:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[B11:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[BV0:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[BV1:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, {{.*}}) -> (f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32) {
// CHECK-NEXT:          %[[TB:.*]] = arith.muli %[[TL]], %{{.*}} : index
// CHECK-NEXT:          %[[T0:.*]] = arith.addi %[[TB]], %{{.*}} : index
//                      first the next tile's pairs (tile + 1: past the last tile every item
//                      is the identity and nothing is loaded), before any shuffle
// CHECK-NEXT:          %[[NTL:.*]] = arith.addi %[[TL]], %[[STEP]] : index
// CHECK-NEXT:          %[[NTB:.*]] = arith.muli %[[NTL]], %{{.*}} : index
// CHECK-NEXT:          %[[NT0:.*]] = arith.addi %[[NTB]], %{{.*}} : index
// CHECK-NEXT:          %[[NIN0:.*]] = arith.cmpi ult, %[[NT0]], %n : index
// CHECK-NEXT:          %[[N00:.*]], %[[N01:.*]], %[[N10:.*]], %[[N11:.*]], %[[NV0:.*]], %[[NV1:.*]] = scf.if %[[NIN0]] -> (f32, f32, f32, f32, f32, f32) {
// CHECK-NEXT:            %[[NXV:.*]] = memref.load %x[%[[BID]], %[[NT0]]] : memref<3x?xf32>
// CHECK-NEXT:            scf.yield %[[K1]], %[[K2]], %one, %zero, %[[NXV]], %zero : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:          } else {
// CHECK-NEXT:            scf.yield %[[ONEF]], %[[ZEROF]], %[[ZEROF]], %[[ONEF]], %[[ZEROF]], %[[ZEROF]] : f32, f32, f32, f32, f32, f32
// CHECK-NEXT:          }
// CHECK-COUNT-3:       memref.load %x[%[[BID]], %{{.*}}] : memref<3x?xf32>
// CHECK-NOT:           "gpu.shuffle"
//                      this tile's items: in range or not (their pairs came round the loop)
// CHECK:               %[[IN0:.*]] = arith.cmpi ult, %[[T0]], %n : index
// CHECK-NOT:           memref.load %x
//                      fold item 1 into item 0: M = M1 M0 (row 0, col 0 first), v = M1 v0 + v1
// CHECK:               %[[P0:.*]] = arith.mulf %[[B00]], %[[A00]] : f32
// CHECK-NEXT:          %[[P1:.*]] = arith.mulf %[[B01]], %[[A10]] : f32
// CHECK-NEXT:          %{{.*}} = arith.addf %[[P0]], %[[P1]] : f32
// CHECK:               %[[Q0:.*]] = arith.mulf %[[B00]], %[[AV0]] : f32
// CHECK-NEXT:          %[[Q1:.*]] = arith.mulf %[[B01]], %[[AV1]] : f32
// CHECK-NEXT:          %[[Q2:.*]] = arith.addf %[[Q0]], %[[Q1]] : f32
// CHECK-NEXT:          %{{.*}} = arith.addf %[[Q2]], %[[BV0]] : f32
//                      Kogge-Stone in the warp, offset 1: all six components shuffled up,
//                      (M, v) <- (M M', M v' + v) from the lower lane, kept without a source
// CHECK-NOT:           "gpu.barrier"
// CHECK:               %[[X00:.*]], %[[OK1:.*]] = "gpu.shuffle"(%[[G00:.*]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[X01:.*]], %{{.*}} = "gpu.shuffle"(%[[G01:.*]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[X10:.*]], %{{.*}} = "gpu.shuffle"(%[[G10:.*]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[X11:.*]], %{{.*}} = "gpu.shuffle"(%[[G11:.*]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[XV0:.*]], %{{.*}} = "gpu.shuffle"(%[[GV0:.*]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[XV1:.*]], %{{.*}} = "gpu.shuffle"(%[[GV1:.*]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[H0A:.*]] = arith.mulf %[[G00]], %[[X00]] : f32
// CHECK-NEXT:          %[[H0B:.*]] = arith.mulf %[[G01]], %[[X10]] : f32
// CHECK-NEXT:          %[[H00:.*]] = arith.addf %[[H0A]], %[[H0B]] : f32
// CHECK:               %[[HVA:.*]] = arith.mulf %[[G00]], %[[XV0]] : f32
// CHECK-NEXT:          %[[HVB:.*]] = arith.mulf %[[G01]], %[[XV1]] : f32
// CHECK-NEXT:          %[[HVC:.*]] = arith.addf %[[HVA]], %[[HVB]] : f32
// CHECK-NEXT:          %[[HV0:.*]] = arith.addf %[[HVC]], %[[GV0]] : f32
// CHECK:               %{{.*}} = arith.select %[[OK1]], %[[H00]], %[[G00]] : f32
// CHECK-NEXT:          %{{.*}} = arith.select %[[OK1]], %{{.*}}, %[[G01]] : f32
// CHECK-NEXT:          %{{.*}} = arith.select %[[OK1]], %{{.*}}, %[[G10]] : f32
// CHECK-NEXT:          %{{.*}} = arith.select %[[OK1]], %{{.*}}, %[[G11]] : f32
// CHECK-NEXT:          %{{.*}} = arith.select %[[OK1]], %[[HV0]], %[[GV0]] : f32
// CHECK-NEXT:          %{{.*}} = arith.select %[[OK1]], %{{.*}}, %[[GV1]] : f32
//                      offsets 2, 4, 8, 16: six shuffles each
// CHECK-COUNT-6:       "gpu.shuffle"(%{{.*}}, %[[O2]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-COUNT-6:       "gpu.shuffle"(%{{.*}}, %[[O4]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-COUNT-6:       "gpu.shuffle"(%{{.*}}, %[[O8]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-COUNT-6:       "gpu.shuffle"(%{{.*}}, %[[O16]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
//                      the inclusive warp prefix, then the previous lane's (one shuffle up each)
// CHECK:               %[[IM00:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK-NEXT:          %[[IM01:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK-NEXT:          %[[IM10:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK-NEXT:          %[[IM11:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK-NEXT:          %[[IV0:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK-NEXT:          %[[IV1:.*]] = arith.select %{{.*}}, %{{.*}}, %{{.*}} : f32
// CHECK-NEXT:          %[[EM00:.*]], %[[EOK:.*]] = "gpu.shuffle"(%[[IM00]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[EM01:.*]], %{{.*}} = "gpu.shuffle"(%[[IM01]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[EM10:.*]], %{{.*}} = "gpu.shuffle"(%[[IM10]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[EM11:.*]], %{{.*}} = "gpu.shuffle"(%[[IM11]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[EV0:.*]], %{{.*}} = "gpu.shuffle"(%[[IV0]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[EV1:.*]], %{{.*}} = "gpu.shuffle"(%[[IV1]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
//                      overflow verdict: a non-finite inclusive aggregate (x - x != 0) flags the
//                      warp by an xor butterfly over the 32 lanes
// CHECK-NEXT:          %{{.*}} = arith.subf %[[IM00]], %[[IM00]] : f32
// CHECK-DAG:           %{{.*}} = arith.subf %[[IM01]], %[[IM01]] : f32
// CHECK-DAG:           %{{.*}} = arith.subf %[[IM10]], %[[IM10]] : f32
// CHECK-DAG:           %{{.*}} = arith.subf %[[IM11]], %[[IM11]] : f32
// CHECK-DAG:           %{{.*}} = arith.subf %[[IV0]], %[[IV0]] : f32
// CHECK-DAG:           %{{.*}} = arith.subf %[[IV1]], %[[IV1]] : f32
// CHECK:               %[[FL0:.*]] = arith.select %{{.*}}, %[[ONE]], %{{.*}} : i32
// CHECK-NEXT:          %[[FX1:.*]], %{{.*}} = "gpu.shuffle"(%[[FL0]], %[[ONE]], %[[W]]) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[FL1:.*]] = arith.ori %[[FL0]], %[[FX1]] : i32
// CHECK-NEXT:          %[[FX2:.*]], %{{.*}} = "gpu.shuffle"(%[[FL1]], %[[O2]], %[[W]]) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[FL2:.*]] = arith.ori %[[FL1]], %[[FX2]] : i32
// CHECK-NEXT:          %[[FX3:.*]], %{{.*}} = "gpu.shuffle"(%[[FL2]], %[[O4]], %[[W]]) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[FL3:.*]] = arith.ori %[[FL2]], %[[FX3]] : i32
// CHECK-NEXT:          %[[FX4:.*]], %{{.*}} = "gpu.shuffle"(%[[FL3]], %[[O8]], %[[W]]) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[FL4:.*]] = arith.ori %[[FL3]], %[[FX4]] : i32
// CHECK-NEXT:          %[[FX5:.*]], %{{.*}} = "gpu.shuffle"(%[[FL4]], %[[O16]], %[[W]]) <{mode = #gpu<shuffle_mode xor>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[FL5:.*]] = arith.ori %[[FL4]], %[[FX5]] : i32
// CHECK-NEXT:          %[[WBAD:.*]] = arith.cmpi ne, %[[FL5]], %{{.*}} : i32
//                      the warp's last lane posts its totals (a flagged warp: NaN in M00),
//                      component-major; then the first barrier of the tile
// CHECK-NEXT:          %[[ISLAST:.*]] = arith.cmpi eq, %[[LANE]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[ISLAST]] {
// CHECK-NEXT:            %[[FLAGV:.*]] = arith.select %[[WBAD]], %[[NAN]], %[[IM00]] : f32
// CHECK-NEXT:            memref.store %[[FLAGV]], %[[SM]][%[[WARP]]] : memref<16xf32, 3 : i64>
// CHECK-NEXT:            %[[WO1:.*]] = arith.addi %[[WARP]], %{{.*}} : index
// CHECK-NEXT:            memref.store %[[IM01]], %[[SM]][%[[WO1]]] : memref<16xf32, 3 : i64>
// CHECK-NEXT:            %[[WO2:.*]] = arith.addi %[[WARP]], %{{.*}} : index
// CHECK-NEXT:            memref.store %[[IM10]], %[[SM]][%[[WO2]]] : memref<16xf32, 3 : i64>
// CHECK-NEXT:            %[[WO3:.*]] = arith.addi %[[WARP]], %{{.*}} : index
// CHECK-NEXT:            memref.store %[[IM11]], %[[SM]][%[[WO3]]] : memref<16xf32, 3 : i64>
// CHECK-NEXT:            memref.store %[[IV0]], %[[SV]][%[[WARP]]] : memref<8xf32, 3 : i64>
// CHECK-NEXT:            %[[WO4:.*]] = arith.addi %[[WARP]], %{{.*}} : index
// CHECK-NEXT:            memref.store %[[IV1]], %[[SV]][%[[WO4]]] : memref<8xf32, 3 : i64>
// CHECK-NEXT:          }
// CHECK-NEXT:          "gpu.barrier"() : () -> ()
//                      warp 0's totals: checked, and folded onto the carry when it comes before
// CHECK-NEXT:          %[[T00:.*]] = memref.load %[[SM]][%[[W0:.*]]] : memref<16xf32, 3 : i64>
// CHECK-NEXT:          %{{.*}} = arith.addi %[[W0]], %{{.*}} : index
// CHECK-NEXT:          %[[T01:.*]] = memref.load %[[SM]][%{{.*}}] : memref<16xf32, 3 : i64>
// CHECK-NEXT:          %{{.*}} = arith.addi %[[W0]], %{{.*}} : index
// CHECK-NEXT:          %[[T10:.*]] = memref.load %[[SM]][%{{.*}}] : memref<16xf32, 3 : i64>
// CHECK-NEXT:          %{{.*}} = arith.addi %[[W0]], %{{.*}} : index
// CHECK-NEXT:          %[[T11:.*]] = memref.load %[[SM]][%{{.*}}] : memref<16xf32, 3 : i64>
// CHECK-NEXT:          %[[TV0:.*]] = memref.load %[[SV]][%[[W0]]] : memref<8xf32, 3 : i64>
// CHECK-NEXT:          %{{.*}} = arith.addi %[[W0]], %{{.*}} : index
// CHECK-NEXT:          %[[TV1:.*]] = memref.load %[[SV]][%{{.*}}] : memref<8xf32, 3 : i64>
// CHECK-NEXT:          %{{.*}} = arith.subf %[[T00]], %[[T00]] : f32
// CHECK:               %[[BEF0:.*]] = arith.cmpi ult, %[[W0]], %[[WARP]] : index
// CHECK-NEXT:          %[[U0:.*]] = arith.mulf %[[T00]], %[[R0]] : f32
// CHECK-NEXT:          %[[U1:.*]] = arith.mulf %[[T01]], %[[R1]] : f32
// CHECK-NEXT:          %[[U2:.*]] = arith.addf %[[U0]], %[[U1]] : f32
// CHECK-NEXT:          %[[U3:.*]] = arith.addf %[[U2]], %[[TV0]] : f32
// CHECK-NEXT:          %[[U4:.*]] = arith.mulf %[[T10]], %[[R0]] : f32
// CHECK-NEXT:          %[[U5:.*]] = arith.mulf %[[T11]], %[[R1]] : f32
// CHECK-NEXT:          %[[U6:.*]] = arith.addf %[[U4]], %[[U5]] : f32
// CHECK-NEXT:          %[[U7:.*]] = arith.addf %[[U6]], %[[TV1]] : f32
// CHECK-NEXT:          %{{.*}} = arith.select %[[BEF0]], %[[U3]], %[[R0]] : f32
// CHECK-NEXT:          %{{.*}} = arith.select %[[BEF0]], %[[U7]], %[[R1]] : f32
//                      warps 1 and 2 likewise; warp 3 (never before another) is only checked
// CHECK-COUNT-2:       arith.cmpi ult, %{{.*}}, %[[WARP]] : index
// CHECK-NOT:           arith.cmpi ult, %{{.*}}, %[[WARP]] : index
// CHECK:               %{{.*}} = memref.load %[[SM]][%{{.*}}] : memref<16xf32, 3 : i64>
// CHECK-COUNT-5:       arith.ori %{{.*}}, %{{.*}} : i1
//                      the tile's verdict: any warp's total not finite
// CHECK-NEXT:          %[[BAD:.*]] = arith.ori %{{.*}}, %{{.*}} : i1
//                      the entering state: the previous lane's prefix applied to the warp's
//                      entering state (lane 0: that state itself)
// CHECK-NEXT:          %[[N0A:.*]] = arith.mulf %[[EM00]], %[[WS0:.*]] : f32
// CHECK-NEXT:          %[[N0B:.*]] = arith.mulf %[[EM01]], %[[WS1:.*]] : f32
// CHECK-NEXT:          %[[N0C:.*]] = arith.addf %[[N0A]], %[[N0B]] : f32
// CHECK-NEXT:          %[[N0:.*]] = arith.addf %[[N0C]], %[[EV0]] : f32
// CHECK-NEXT:          %[[N1A:.*]] = arith.mulf %[[EM10]], %[[WS0]] : f32
// CHECK-NEXT:          %[[N1B:.*]] = arith.mulf %[[EM11]], %[[WS1]] : f32
// CHECK-NEXT:          %[[N1C:.*]] = arith.addf %[[N1A]], %[[N1B]] : f32
// CHECK-NEXT:          %[[N1:.*]] = arith.addf %[[N1C]], %[[EV1]] : f32
// CHECK-NEXT:          %[[ENT0:.*]] = arith.select %[[EOK]], %[[N0]], %[[WS0]] : f32
// CHECK-NEXT:          %[[ENT1:.*]] = arith.select %[[EOK]], %[[N1]], %[[WS1]] : f32
//                      a flagged tile: entering states in the loop's order, one thread after the
//                      other (barriers), the first from the register carry, the others from sC
// CHECK-NEXT:          %[[G0:.*]], %[[G1:.*]] = scf.if %[[BAD]] -> (f32, f32) {
// CHECK-NEXT:            %[[FO0:.*]], %[[FO1:.*]] = scf.for
// CHECK-NEXT:              "gpu.barrier"() : () -> ()
// CHECK:                     scf.yield %[[R0]], %[[R1]] : f32, f32
// CHECK:                     memref.load %[[SC]]
// CHECK:                   memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:              memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:              scf.yield
// CHECK-NEXT:            } else {
// CHECK-NEXT:              scf.yield
// CHECK-NEXT:            }
// CHECK-NEXT:            scf.yield
// CHECK-NEXT:          }
// CHECK-NEXT:          scf.yield %[[FO0]], %[[FO1]] : f32, f32
// CHECK-NEXT:        } else {
// CHECK-NEXT:          scf.yield %[[ENT0]], %[[ENT1]] : f32, f32
// CHECK-NEXT:        }
//                      replay from the entering state, then the cloned emit
// CHECK-NEXT:          %{{.*}}, %{{.*}} = scf.if %[[IN0]] -> (f32, f32) {
// CHECK-NEXT:            %[[R0M:.*]] = arith.mulf %[[A00]], %[[G0]] : f32
// CHECK-NEXT:            %[[R1M:.*]] = arith.mulf %[[A01]], %[[G1]] : f32
// CHECK-NEXT:            %[[R2M:.*]] = arith.addf %[[R0M]], %[[R1M]] : f32
// CHECK-NEXT:            %[[NEW0:.*]] = arith.addf %[[R2M]], %[[AV0]] : f32
// CHECK:                 memref.store %[[NEW0]], %[[S]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            memref.store %{{.*}}, %[[S]][%{{.*}}] : memref<2xf32>
// CHECK-NEXT:            %[[YV:.*]] = memref.load %[[S]][%c0] : memref<2xf32>
// CHECK-NEXT:            memref.store %[[YV]], %y[%[[BID]], %[[T0]]] : memref<3x?xf32>
// CHECK-COUNT-3:         memref.store %{{.*}}, %y[%[[BID]], %{{.*}}] : memref<3x?xf32>
//                      the last thread publishes the state as the next tile's carry; the
//                      tile's second barrier; every thread takes the carry into registers
// CHECK-NOT:           "gpu.barrier"
// CHECK:               %[[PUB:.*]] = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[PUB]] {
// CHECK-NEXT:            memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:            memref.store %{{.*}}, %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:          }
// CHECK-NEXT:          "gpu.barrier"() : () -> ()
// CHECK-NEXT:          %[[NC0:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:          %[[NC1:.*]] = memref.load %[[SC]][%{{.*}}] : memref<2xf32, 3 : i64>
// CHECK-NEXT:          scf.yield %[[NC0]], %[[NC1]], %[[N00]], %[[N01]], %[[N10]], %[[N11]], %[[NV0]], %[[NV1]], {{.*}} : f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32, f32
// CHECK-NEXT:        }
// CHECK-NEXT:        "gpu.return"() : () -> ()
// CHECK-NEXT:      }) {sym_name = "scan_linear_0", gpu.kernel, scanweaver.launch = {kernel_name = "scan_linear_0", module_name = "scanweaver_kernels", func_name = "iir2", grid = [3 : i64, 1 : i64, 1 : i64], block = [128 : i64, 1 : i64, 1 : i64], shared_bytes = 104 : i64
//                  depth 0 (i32): one block; integer states wrap, so no overflow guard; after
//                  the last tile thread 0 writes the final state
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_linear_1_sM", type = memref<16xi32, 3 : i64>
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_linear_1_sV", type = memref<8xi32, 3 : i64>
// CHECK-NEXT:      "memref.global"() <{sym_name = "scan_linear_1_sC", type = memref<2xi32, 3 : i64>
// CHECK-NEXT:      "gpu.func"() <{function_type = (memref<?xi32>, memref<2xi32>, memref<?xi32>, memref<2xi32>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%x: memref<?xi32>, %k: memref<2xi32>, %y: memref<?xi32>, %last: memref<2xi32>):
// CHECK-NEXT:        %[[TID1:.*]] = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK:             %[[K1S:.*]] = memref.load %k[%c0] : memref<2xi32>
// CHECK:             %[[S1:.*]] = memref.alloca() : memref<2xi32>
// CHECK:             %[[SM1:.*]] = memref.get_global @scan_linear_1_sM
// CHECK-NEXT:        %[[SV1:.*]] = memref.get_global @scan_linear_1_sV
// CHECK-NEXT:        %[[SC1:.*]] = memref.get_global @scan_linear_1_sC
// CHECK:             %[[LANE1:.*]] = arith.remui %[[TID1]], %{{.*}} : index
// CHECK-NEXT:        %[[WARP1:.*]] = arith.divui %[[TID1]], %{{.*}} : index
// CHECK-NEXT:        "gpu.barrier"() : () -> ()
// CHECK-NEXT:        %[[D0:.*]] = memref.load %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:        %[[D1:.*]] = memref.load %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK:             scf.for %{{.*}} = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[E0:.*]] = %[[D0]], %[[E1:.*]] = %[[D1]], {{.*}}) -> (i32, i32, i32, {{.*}}) {
// CHECK-NOT:           shuffle_mode xor
// CHECK-COUNT-6:       "gpu.shuffle"(%{{.*}}, %{{.*}}, %{{.*}}) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NOT:           shuffle_mode xor
// CHECK-NOT:           "gpu.barrier"
// CHECK:               %[[ISLAST1:.*]] = arith.cmpi eq, %[[LANE1]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[ISLAST1]] {
// CHECK-NEXT:            memref.store %{{.*}}, %[[SM1]][%[[WARP1]]] : memref<16xi32, 3 : i64>
// CHECK:                 memref.store %{{.*}}, %[[SV1]][%[[WARP1]]] : memref<8xi32, 3 : i64>
// CHECK:               }
// CHECK-NEXT:          "gpu.barrier"() : () -> ()
// CHECK-NEXT:          memref.load %[[SM1]]
// CHECK:               arith.muli %{{.*}}, %[[E0]] : i32
// CHECK-NOT:           "gpu.barrier"
// CHECK:               memref.store %{{.*}}, %y[%{{.*}}] : memref<?xi32>
// CHECK-NOT:           "gpu.barrier"
// CHECK:               %[[PUB1:.*]] = arith.cmpi eq, %[[TID1]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[PUB1]] {
// CHECK-NEXT:            memref.store %{{.*}}, %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:            memref.store %{{.*}}, %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:          }
// CHECK-NEXT:          "gpu.barrier"() : () -> ()
// CHECK-NEXT:          %[[NE0:.*]] = memref.load %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:          %[[NE1:.*]] = memref.load %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:          scf.yield %[[NE0]], %[[NE1]], {{.*}} : i32, i32, i32, {{.*}}
// CHECK-NEXT:        }
//                    after the tiles: thread 0 copies the carry into the state, runs the epilogue
// CHECK-NEXT:        "gpu.barrier"() : () -> ()
// CHECK-NEXT:        %{{.*}} = arith.cmpi eq, %[[TID1]], %{{.*}} : index
// CHECK-NEXT:        scf.if %{{.*}} {
// CHECK-NEXT:          %[[F0:.*]] = memref.load %[[SC1]][%{{.*}}] : memref<2xi32, 3 : i64>
// CHECK-NEXT:          memref.store %[[F0]], %[[S1]][%{{.*}}] : memref<2xi32>
// CHECK:               %r1 = memref.load %[[S1]][%c0] : memref<2xi32>
// CHECK:               memref.store %r1, %last[%c0] : memref<2xi32>
// CHECK:             "gpu.return"() : () -> ()
// CHECK-NEXT:      }) {sym_name = "scan_linear_1", gpu.kernel, scanweaver.launch = {kernel_name = "scan_linear_1", module_name = "scanweaver_kernels", func_name = "iir2_single", grid = [1 : i64, 1 : i64, 1 : i64]
// CHECK-SAME:      notes = "scan.linear_recurrence over no channel loop (one block), state 2 x i32
