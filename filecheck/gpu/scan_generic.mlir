// RUN: xdsl-opt %s -p scan-to-gpu | filecheck %s
// A generic scan.scan (argmax over (f32, i32), reverse, dynamic length) becomes one
// chained-tile kernel (128 threads x 4 items): the next tile's loads (prefetch: the loop
// carries them) -> in-order fold -> warp shuffle scan -> warp totals through shared
// memory -> prefix on the carry -> replay -> stores -> publish the carry; 2 barriers per
// tile. A full tile (it ends within the length, the row length and the tile start are
// multiples of 4, and every base is 16-byte aligned: one test per kernel) moves each
// operand with one 16-byte vector.load / vector.store per thread; any other tile, and a
// device view off a 16-byte boundary, uses guarded scalar accesses.
// No identity: every combine is guarded by tests for "empty".

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
//                  the bases: one test for the kernel, (x0 | x1 | y0 | y1) & 15 == 0 (a device
//                  view off a 16-byte boundary takes the scalar path)
// CHECK-NEXT:        %[[PX0:.*]] = "memref.extract_aligned_pointer_as_index"(%x0) : (memref<8x?xf32>) -> index
// CHECK-NEXT:        %[[PX1:.*]] = "memref.extract_aligned_pointer_as_index"(%x1) : (memref<8x?xi32>) -> index
// CHECK-NEXT:        %[[OR1:.*]] = arith.ori %[[PX0]], %[[PX1]] : index
// CHECK-NEXT:        %[[PY0:.*]] = "memref.extract_aligned_pointer_as_index"(%y0) : (memref<8x?xf32>) -> index
// CHECK-NEXT:        %[[OR2:.*]] = arith.ori %[[OR1]], %[[PY0]] : index
// CHECK-NEXT:        %[[PY1:.*]] = "memref.extract_aligned_pointer_as_index"(%y1) : (memref<8x?xi32>) -> index
// CHECK-NEXT:        %[[OR3:.*]] = arith.ori %[[OR2]], %[[PY1]] : index
// CHECK-NEXT:        %[[M15:.*]] = arith.constant 15 : index
// CHECK-NEXT:        %[[Z:.*]] = arith.constant 0 : index
// CHECK-NEXT:        %[[LOW:.*]] = arith.andi %[[OR3]], %[[M15]] : index
// CHECK-NEXT:        %[[BASES:.*]] = arith.cmpi eq, %[[LOW]], %[[Z]] : index
// CHECK-NEXT:        %[[S0:.*]] = memref.get_global @scan_generic_0_s0
// CHECK-NEXT:        %[[K0:.*]] = memref.get_global @scan_generic_0_c0
// CHECK-NEXT:        %[[S1:.*]] = memref.get_global @scan_generic_0_s1
// CHECK-NEXT:        %[[K1:.*]] = memref.get_global @scan_generic_0_c1
// CHECK-NEXT:        %[[TID:.*]] = "gpu.thread_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK-NEXT:        %[[BID:.*]] = "gpu.block_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK:             %[[LEN:.*]] = memref.dim %y0, %{{.*}} : memref<8x?xf32>
// CHECK:             %[[C4:.*]] = arith.constant 4 : index
// CHECK-NEXT:        %[[TB:.*]] = arith.muli %[[TID]], %[[C4]] : index
// CHECK-NEXT:        %[[RLAST:.*]] = arith.subi %[[LEN]], %{{.*}} : index
//                    prefetch: tile 0's elements before the loop (a full tile: it ends within
//                    the length, the row length and the tile start are multiples of 4, and
//                    the bases are aligned)
// CHECK-NEXT:        %[[BASE0:.*]] = arith.muli %{{.*}}, %{{.*}} : index
// CHECK-NEXT:        %[[FT0:.*]] = arith.addi %[[BASE0]], %[[TB]] : index
// CHECK-NEXT:        %[[ROW:.*]] = memref.dim %x0, %{{.*}} : memref<8x?xf32>
// CHECK-NEXT:        %[[END:.*]] = arith.addi %[[BASE0]], %{{.*}} : index
// CHECK-NEXT:        %[[INSIDE:.*]] = arith.cmpi ule, %[[END]], %[[LEN]] : index
// CHECK-NEXT:        %[[RR:.*]] = arith.remui %[[ROW]], %[[C4]] : index
// CHECK-NEXT:        %[[RA:.*]] = arith.cmpi eq, %[[RR]], %{{.*}} : index
// CHECK-NEXT:        %[[TR:.*]] = arith.remui %[[BASE0]], %[[C4]] : index
// CHECK-NEXT:        %[[TA:.*]] = arith.cmpi eq, %[[TR]], %{{.*}} : index
// CHECK-NEXT:        %[[AL:.*]] = arith.andi %[[RA]], %[[TA]] : i1
// CHECK-NEXT:        %[[FULL0:.*]] = arith.andi %[[INSIDE]], %[[AL]] : i1
// CHECK-NEXT:        %[[C3:.*]] = arith.constant 3 : index
// CHECK:             %[[VEC0:.*]] = arith.andi %[[FULL0]], %[[BASES]] : i1
//                    full tile: one vector load per operand at the reversed position
//                    (len-1-t-3); item 0 is the vector's last element
// CHECK-NEXT:        %[[P0V:.*]], %[[P0I:.*]], %[[P1V:.*]], %[[P1I:.*]], %[[P2V:.*]], %[[P2I:.*]], %[[P3V:.*]], %[[P3I:.*]] = scf.if %[[VEC0]] -> (f32, i32, f32, i32, f32, i32, f32, i32) {
// CHECK-NEXT:          %[[Q:.*]] = arith.subi %[[RLAST]], %[[FT0]] : index
// CHECK-NEXT:          %[[QV:.*]] = arith.subi %[[Q]], %[[C3]] : index
// CHECK-NEXT:          %[[XV:.*]] = vector.load %x0[%[[BID]], %[[QV]]] {alignment = 16 : i64} : memref<8x?xf32>, vector<4xf32>
// CHECK-NEXT:          %[[E0:.*]] = vector.extract %[[XV]][0] : f32 from vector<4xf32>
// CHECK-NEXT:          %[[E1:.*]] = vector.extract %[[XV]][1] : f32 from vector<4xf32>
// CHECK-NEXT:          %[[E2:.*]] = vector.extract %[[XV]][2] : f32 from vector<4xf32>
// CHECK-NEXT:          %[[E3:.*]] = vector.extract %[[XV]][3] : f32 from vector<4xf32>
// CHECK-NEXT:          %[[QI:.*]] = arith.subi %[[RLAST]], %[[FT0]] : index
// CHECK-NEXT:          %[[QIV:.*]] = arith.subi %[[QI]], %[[C3]] : index
// CHECK-NEXT:          %[[XI:.*]] = vector.load %x1[%[[BID]], %[[QIV]]] {alignment = 16 : i64} : memref<8x?xi32>, vector<4xi32>
// CHECK-NEXT:          %[[F0:.*]] = vector.extract %[[XI]][0] : i32 from vector<4xi32>
// CHECK-NEXT:          %[[F1:.*]] = vector.extract %[[XI]][1] : i32 from vector<4xi32>
// CHECK-NEXT:          %[[F2:.*]] = vector.extract %[[XI]][2] : i32 from vector<4xi32>
// CHECK-NEXT:          %[[F3:.*]] = vector.extract %[[XI]][3] : i32 from vector<4xi32>
// CHECK-NEXT:          scf.yield %[[E3]], %[[F3]], %[[E2]], %[[F2]], %[[E1]], %[[F1]], %[[E0]], %[[F0]] : f32, i32, f32, i32, f32, i32, f32, i32
// CHECK-NEXT:        } else {
//                      other tiles: guarded scalar loads at the reversed position, zeros
//                      past the end
// CHECK-NEXT:          %[[G0:.*]] = arith.cmpi ult, %[[FT0]], %[[LEN]] : index
// CHECK-NEXT:          %[[L0V:.*]], %[[L0I:.*]] = scf.if %[[G0]] -> (f32, i32) {
// CHECK-NEXT:            %[[Q0:.*]] = arith.subi %[[RLAST]], %[[FT0]] : index
// CHECK-NEXT:            %[[LV:.*]] = memref.load %x0[%[[BID]], %[[Q0]]] : memref<8x?xf32>
// CHECK-NEXT:            %[[LI:.*]] = memref.load %x1[%[[BID]], %[[Q0]]] : memref<8x?xi32>
// CHECK-NEXT:            scf.yield %[[LV]], %[[LI]] : f32, i32
// CHECK-NEXT:          } else {
// CHECK-NEXT:            scf.yield %{{.*}}, %{{.*}} : f32, i32
// CHECK-NEXT:          }
// CHECK-NEXT:          %[[G1T:.*]] = arith.addi %[[FT0]], %{{.*}} : index
// CHECK-NEXT:          %[[G1:.*]] = arith.cmpi ult, %[[G1T]], %[[LEN]] : index
// CHECK-NEXT:          %{{.*}}, %{{.*}} = scf.if %[[G1]] -> (f32, i32) {
// CHECK-NEXT:            %[[Q1:.*]] = arith.subi %[[RLAST]], %[[G1T]] : index
// CHECK-NEXT:            %{{.*}} = memref.load %x0[%[[BID]], %[[Q1]]] : memref<8x?xf32>
// CHECK-NEXT:            %{{.*}} = memref.load %x1[%[[BID]], %[[Q1]]] : memref<8x?xi32>
// CHECK-COUNT-2:       memref.load %x1[%[[BID]], %{{.*}}] : memref<8x?xi32>
// CHECK:               scf.yield %[[L0V]], %[[L0I]], %{{.*}} : f32, i32, f32, i32, f32, i32, f32, i32
// CHECK-NEXT:        }
//                    the shuffle offsets 1, 2, 4, 8, 16 over a warp of 32 lanes
// CHECK-DAG:         %[[O1:.*]] = arith.constant 1 : i32
// CHECK-DAG:         %[[W:.*]] = arith.constant 32 : i32
// CHECK-DAG:         %[[O2:.*]] = arith.constant 2 : i32
// CHECK-DAG:         %[[O4:.*]] = arith.constant 4 : i32
// CHECK-DAG:         %[[O8:.*]] = arith.constant 8 : i32
// CHECK-DAG:         %[[O16:.*]] = arith.constant 16 : i32
//                    the tile loop carries this tile's elements (loaded by the tile before)
// CHECK:             scf.for %[[TILE:[0-9a-z_]+]] = %{{.*}} to %{{.*}} step %[[ONE:[0-9a-z_]+]] iter_args(%[[V0:[0-9a-z_]+]] = %[[P0V]], %[[I0:[0-9a-z_]+]] = %[[P0I]], %[[V1:[0-9a-z_]+]] = %[[P1V]], %[[I1:[0-9a-z_]+]] = %[[P1I]], %[[V2:[0-9a-z_]+]] = %[[P2V]], %[[I2:[0-9a-z_]+]] = %[[P2I]], %[[V3:[0-9a-z_]+]] = %[[P3V]], %[[I3:[0-9a-z_]+]] = %[[P3I]]) -> (f32, i32, f32, i32, f32, i32, f32, i32) {
// CHECK-NEXT:          %[[BASE:.*]] = arith.muli %[[TILE]], %{{.*}} : index
// CHECK-NEXT:          %[[T0:.*]] = arith.addi %[[BASE]], %[[TB]] : index
// CHECK-NEXT:          %[[CARRY:.*]] = arith.cmpi ugt, %[[TILE]], %{{.*}} : index
//                      first, the next tile's loads (tile + 1; past the last tile every
//                      guard is false and nothing is read), before this tile's shuffles
// CHECK-NEXT:          %[[NEXT:.*]] = arith.addi %[[TILE]], %[[ONE]] : index
// CHECK-NEXT:          %[[NBASE:.*]] = arith.muli %[[NEXT]], %{{.*}} : index
// CHECK-NEXT:          %[[NT0:.*]] = arith.addi %[[NBASE]], %[[TB]] : index
// CHECK-NEXT:          memref.dim %x0, %{{.*}} : memref<8x?xf32>
// CHECK-NEXT:          %[[NEND:.*]] = arith.addi %[[NBASE]], %{{.*}} : index
// CHECK-NEXT:          %[[NIN:.*]] = arith.cmpi ule, %[[NEND]], %[[LEN]] : index
// CHECK-NEXT:          arith.remui
// CHECK-NEXT:          arith.cmpi eq
// CHECK-NEXT:          %[[NTR:.*]] = arith.remui %[[NBASE]], %[[C4]] : index
// CHECK-NEXT:          arith.cmpi eq
// CHECK-NEXT:          %[[NAL:.*]] = arith.andi
// CHECK-NEXT:          %[[NFULL:.*]] = arith.andi %[[NIN]], %[[NAL]] : i1
// CHECK-NEXT:          %[[NVEC:.*]] = arith.andi %[[NFULL]], %[[BASES]] : i1
// CHECK-NEXT:          %[[N0V:.*]], %[[N0I:.*]], %[[N1V:.*]], %[[N1I:.*]], %[[N2V:.*]], %[[N2I:.*]], %[[N3V:.*]], %[[N3I:.*]] = scf.if %[[NVEC]] -> (f32, i32, f32, i32, f32, i32, f32, i32) {
// CHECK-NEXT:            %[[NQ:.*]] = arith.subi %[[RLAST]], %[[NT0]] : index
// CHECK-NEXT:            %[[NQV:.*]] = arith.subi %[[NQ]], %[[C3]] : index
// CHECK-NEXT:            vector.load %x0[%[[BID]], %[[NQV]]] {alignment = 16 : i64} : memref<8x?xf32>, vector<4xf32>
// CHECK:                 vector.load %x1[%[[BID]], %{{.*}}] {alignment = 16 : i64} : memref<8x?xi32>, vector<4xi32>
// CHECK:               } else {
// CHECK-NEXT:            %[[NG0:.*]] = arith.cmpi ult, %[[NT0]], %[[LEN]] : index
// CHECK-NEXT:            scf.if %[[NG0]] -> (f32, i32) {
// CHECK-NEXT:              %[[NQ0:.*]] = arith.subi %[[RLAST]], %[[NT0]] : index
// CHECK-NEXT:              memref.load %x0[%[[BID]], %[[NQ0]]] : memref<8x?xf32>
// CHECK-COUNT-3:         memref.load %x1[%[[BID]], %{{.*}}] : memref<8x?xi32>
// CHECK:               }
//                      this tile's full-tile test (for its stores)
// CHECK-NOT:           gpu.shuffle
// CHECK:               %[[ROWK:.*]] = memref.dim %x0, %{{.*}} : memref<8x?xf32>
// CHECK-NEXT:          %[[ENDK:.*]] = arith.addi %[[BASE]], %{{.*}} : index
// CHECK-NEXT:          %[[INK:.*]] = arith.cmpi ule, %[[ENDK]], %[[LEN]] : index
// CHECK-NEXT:          %[[RRK:.*]] = arith.remui %[[ROWK]], %[[C4]] : index
// CHECK-NEXT:          %[[RAK:.*]] = arith.cmpi eq, %[[RRK]], %{{.*}} : index
// CHECK-NEXT:          %[[TRK:.*]] = arith.remui %[[BASE]], %[[C4]] : index
// CHECK-NEXT:          %[[TAK:.*]] = arith.cmpi eq, %[[TRK]], %{{.*}} : index
// CHECK-NEXT:          %[[ALK:.*]] = arith.andi %[[RAK]], %[[TAK]] : i1
// CHECK-NEXT:          %[[FULL:.*]] = arith.andi %[[INK]], %[[ALK]] : i1
//                      which items are in range (item k at t+k)
// CHECK-NEXT:          %[[IN0:.*]] = arith.cmpi ult, %[[T0]], %[[LEN]] : index
// CHECK-NEXT:          %[[T1:.*]] = arith.addi %[[T0]], %{{.*}} : index
// CHECK-NEXT:          %[[IN1:.*]] = arith.cmpi ult, %[[T1]], %[[LEN]] : index
// CHECK-NEXT:          %[[T2:.*]] = arith.addi %[[T0]], %{{.*}} : index
// CHECK-NEXT:          %[[IN2:.*]] = arith.cmpi ult, %[[T2]], %[[LEN]] : index
// CHECK-NEXT:          %[[T3:.*]] = arith.addi %[[T0]], %[[C3]] : index
// CHECK-NEXT:          %[[IN3:.*]] = arith.cmpi ult, %[[T3]], %[[LEN]] : index
// CHECK-NEXT:          %[[LANE:.*]] = arith.remui %[[TID]], %{{.*}} : index
// CHECK-NEXT:          %[[WARP:.*]] = arith.divui %[[TID]], %{{.*}} : index
//                      in-order fold of the valid items: combine(earlier, later)
// CHECK-NEXT:          %[[A1V:.*]], %[[A1I:.*]] = scf.if %[[IN1]] -> (f32, i32) {
// CHECK-NEXT:            %[[GT:.*]] = arith.cmpf ogt, %[[V1]], %[[V0]] : f32
// CHECK-NEXT:            %{{.*}} = arith.select %[[GT]], %[[V1]], %[[V0]] : f32
// CHECK-NEXT:            %{{.*}} = arith.select %[[GT]], %[[I1]], %[[I0]] : i32
// CHECK:               %[[A2V:.*]], %{{.*}} = scf.if %[[IN2]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}} = arith.cmpf ogt, %[[V2]], %[[A1V]] : f32
// CHECK:               %[[AGV:.*]], %[[AGI:.*]] = scf.if %[[IN3]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}} = arith.cmpf ogt, %[[V3]], %[[A2V]] : f32
//                      warp scan: Kogge-Stone over 32 lanes, 5 shuffle-up steps per operand,
//                      combining only where this thread holds a valid step (valid steps are a
//                      prefix of the tile, so the lane it reads holds complete ones)
// CHECK:               %[[SV:.*]], %[[SOK:.*]] = "gpu.shuffle"(%[[AGV]], %[[O1]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[SI:.*]], %{{.*}} = "gpu.shuffle"(%[[AGI]], %[[O1]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[CV1:.*]], %[[CI1:.*]] = scf.if %[[IN0]] -> (f32, i32) {
// CHECK-NEXT:            %[[GT1:.*]] = arith.cmpf ogt, %[[AGV]], %[[SV]] : f32
// CHECK-NEXT:            %{{.*}} = arith.select %[[GT1]], %[[AGV]], %[[SV]] : f32
// CHECK-NEXT:            %{{.*}} = arith.select %[[GT1]], %[[AGI]], %[[SI]] : i32
// CHECK:               %[[X1V:.*]] = arith.select %[[SOK]], %[[CV1]], %[[AGV]] : f32
// CHECK-NEXT:          %[[X1I:.*]] = arith.select %[[SOK]], %[[CI1]], %[[AGI]] : i32
// CHECK-NEXT:          "gpu.shuffle"(%[[X1V]], %[[O2]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          "gpu.shuffle"(%[[X1I]], %[[O2]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          scf.if %[[IN0]] -> (f32, i32) {
// CHECK:               "gpu.shuffle"(%{{.*}}, %[[O4]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          "gpu.shuffle"(%{{.*}}, %[[O4]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
// CHECK:               "gpu.shuffle"(%{{.*}}, %[[O8]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          "gpu.shuffle"(%{{.*}}, %[[O8]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
// CHECK:               %[[Y16V:.*]], %[[OK16:.*]] = "gpu.shuffle"(%[[X8V:.*]], %[[O16]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %{{.*}}, %{{.*}} = "gpu.shuffle"(%[[X8I:.*]], %[[O16]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
// CHECK-NEXT:          %[[C16V:.*]], %[[C16I:.*]] = scf.if %[[IN0]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}} = arith.cmpf ogt, %[[X8V]], %[[Y16V]] : f32
// CHECK:               %[[INCV:.*]] = arith.select %[[OK16]], %[[C16V]], %[[X8V]] : f32
// CHECK-NEXT:          %[[INCI:.*]] = arith.select %[[OK16]], %[[C16I]], %[[X8I]] : i32
//                      the exclusive shift by one lane
// CHECK-NEXT:          %[[EV:.*]], %[[HASPREV:.*]] = "gpu.shuffle"(%[[INCV]], %[[O1]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (f32, i32, i32) -> (f32, i1)
// CHECK-NEXT:          %[[EI:.*]], %{{.*}} = "gpu.shuffle"(%[[INCI]], %[[O1]], %[[W]]) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
//                      the last lane of each warp posts the warp total; one barrier
// CHECK-NEXT:          %[[L31:.*]] = arith.cmpi eq, %[[LANE]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[L31]] {
// CHECK-NEXT:            memref.store %[[INCV]], %[[S0]][%[[WARP]]] : memref<128xf32, 3 : i64>
// CHECK-NEXT:            memref.store %[[INCI]], %[[S1]][%[[WARP]]] : memref<128xi32, 3 : i64>
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
// CHECK:               %[[PV:.*]], %[[PI:.*]] = scf.if %[[HASPREV]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}}, %{{.*}} = scf.if %{{.*}} -> (f32, i32) {
// CHECK-NEXT:              %{{.*}} = arith.cmpf ogt, %[[EV]], %{{.*}} : f32
// CHECK-NEXT:              %{{.*}} = arith.select %{{.*}}, %[[EV]], %{{.*}} : f32
// CHECK-NEXT:              %{{.*}} = arith.select %{{.*}}, %[[EI]], %{{.*}} : i32
// CHECK:               %[[PVALID:.*]] = arith.ori %{{.*}}, %[[HASPREV]] : i1
//                      replay from the prefix (if any), in order over the valid items
// CHECK-NEXT:          %[[H0V:.*]], %[[H0I:.*]] = scf.if %[[IN0]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}}, %{{.*}} = scf.if %[[PVALID]] -> (f32, i32) {
// CHECK-NEXT:              %{{.*}} = arith.cmpf ogt, %[[V0]], %[[PV]] : f32
// CHECK:                 } else {
// CHECK-NEXT:              scf.yield %[[V0]], %[[I0]] : f32, i32
// CHECK:               } else {
// CHECK-NEXT:            scf.yield %[[PV]], %[[PI]] : f32, i32
// CHECK:               %[[H1V:.*]], %[[H1I:.*]] = scf.if %[[IN1]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}} = arith.cmpf ogt, %[[V1]], %[[H0V]] : f32
// CHECK:               %[[H2V:.*]], %[[H2I:.*]] = scf.if %[[IN2]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}} = arith.cmpf ogt, %[[V2]], %[[H1V]] : f32
// CHECK:               %[[H3V:.*]], %[[H3I:.*]] = scf.if %[[IN3]] -> (f32, i32) {
// CHECK-NEXT:            %{{.*}} = arith.cmpf ogt, %[[V3]], %[[H2V]] : f32
//                      full tile: one vector store per result, item 0 in the last element;
//                      other tiles: guarded scalar stores
// CHECK:               %[[STV:.*]] = arith.andi %[[FULL]], %[[BASES]] : i1
// CHECK-NEXT:          scf.if %[[STV]] {
// CHECK-NEXT:            %[[R:.*]] = arith.subi %[[RLAST]], %[[T0]] : index
// CHECK-NEXT:            %[[RV:.*]] = arith.subi %[[R]], %[[C3]] : index
// CHECK-NEXT:            %[[B0:.*]] = vector.broadcast %[[H3V]] : f32 to vector<4xf32>
// CHECK-NEXT:            %[[B1:.*]] = vector.insert %[[H2V]], %[[B0]] [1] : f32 into vector<4xf32>
// CHECK-NEXT:            %[[B2:.*]] = vector.insert %[[H1V]], %[[B1]] [2] : f32 into vector<4xf32>
// CHECK-NEXT:            %[[B3:.*]] = vector.insert %[[H0V]], %[[B2]] [3] : f32 into vector<4xf32>
// CHECK-NEXT:            vector.store %[[B3]], %y0[%[[BID]], %[[RV]]] {alignment = 16 : i64} : memref<8x?xf32>, vector<4xf32>
// CHECK-NEXT:            %[[RI:.*]] = arith.subi %[[RLAST]], %[[T0]] : index
// CHECK-NEXT:            %[[RIV:.*]] = arith.subi %[[RI]], %[[C3]] : index
// CHECK-NEXT:            %[[D0:.*]] = vector.broadcast %[[H3I]] : i32 to vector<4xi32>
// CHECK-NEXT:            %[[D1:.*]] = vector.insert %[[H2I]], %[[D0]] [1] : i32 into vector<4xi32>
// CHECK-NEXT:            %[[D2:.*]] = vector.insert %[[H1I]], %[[D1]] [2] : i32 into vector<4xi32>
// CHECK-NEXT:            %[[D3:.*]] = vector.insert %[[H0I]], %[[D2]] [3] : i32 into vector<4xi32>
// CHECK-NEXT:            vector.store %[[D3]], %y1[%[[BID]], %[[RIV]]] {alignment = 16 : i64} : memref<8x?xi32>, vector<4xi32>
// CHECK-NEXT:          } else {
// CHECK-NEXT:            scf.if %[[IN0]] {
// CHECK-NEXT:              %[[W0:.*]] = arith.subi %[[RLAST]], %[[T0]] : index
// CHECK-NEXT:              memref.store %[[H0V]], %y0[%[[BID]], %[[W0]]] : memref<8x?xf32>
// CHECK-NEXT:              memref.store %[[H0I]], %y1[%[[BID]], %[[W0]]] : memref<8x?xi32>
// CHECK-NEXT:            }
// CHECK-NEXT:            scf.if %[[IN1]] {
// CHECK-NEXT:              %[[W1:.*]] = arith.subi %[[RLAST]], %[[T1]] : index
// CHECK-NEXT:              memref.store %[[H1V]], %y0[%[[BID]], %[[W1]]] : memref<8x?xf32>
// CHECK-NEXT:              memref.store %[[H1I]], %y1[%[[BID]], %[[W1]]] : memref<8x?xi32>
// CHECK-NEXT:            }
// CHECK-NEXT:            scf.if %[[IN2]] {
// CHECK-NEXT:              %[[W2:.*]] = arith.subi %[[RLAST]], %[[T2]] : index
// CHECK-NEXT:              memref.store %[[H2V]], %y0[%[[BID]], %[[W2]]] : memref<8x?xf32>
// CHECK-NEXT:              memref.store %[[H2I]], %y1[%[[BID]], %[[W2]]] : memref<8x?xi32>
// CHECK-NEXT:            }
// CHECK-NEXT:            scf.if %[[IN3]] {
// CHECK-NEXT:              %[[W3:.*]] = arith.subi %[[RLAST]], %[[T3]] : index
// CHECK-NEXT:              memref.store %[[H3V]], %y0[%[[BID]], %[[W3]]] : memref<8x?xf32>
// CHECK-NEXT:              memref.store %[[H3I]], %y1[%[[BID]], %[[W3]]] : memref<8x?xi32>
// CHECK-NEXT:            }
// CHECK-NEXT:          }
//                      every thread read the totals and the carry: a barrier before the next
// CHECK-NEXT:          "gpu.barrier"() : () -> ()
//                      the last thread publishes the carry
// CHECK-NEXT:          %[[LAST:.*]] = arith.cmpi eq, %[[TID]], %{{.*}} : index
// CHECK-NEXT:          scf.if %[[LAST]] {
// CHECK-NEXT:            memref.store %[[H3V]], %[[K0]][%{{.*}}] : memref<1xf32, 3 : i64>
// CHECK-NEXT:            memref.store %[[H3I]], %[[K1]][%{{.*}}] : memref<1xi32, 3 : i64>
// CHECK-NEXT:          }
//                      the next tile's elements go round the loop
// CHECK-NEXT:          scf.yield %[[N0V]], %[[N0I]], %[[N1V]], %[[N1I]], %[[N2V]], %[[N2I]], %[[N3V]], %[[N3I]] : f32, i32, f32, i32, f32, i32, f32, i32
// CHECK-NEXT:        }
// CHECK-NEXT:        "gpu.return"() : () -> ()
// CHECK-NEXT:      }) {sym_name = "scan_generic_0", gpu.kernel, scanweaver.launch = {kernel_name = "scan_generic_0", module_name = "scanweaver_kernels", func_name = "argmax", grid = [8 : i64, 1 : i64, 1 : i64], block = [128 : i64, 1 : i64, 1 : i64], shared_bytes = 1044 : i64
// CHECK-SAME:      args = {{\[}}["x0", "in", "f32", [8 : i64, "?"]], ["x1", "in", "i32", [8 : i64, "?"]], ["y0", "out", "f32", [8 : i64, "?"]], ["y1", "out", "i32", [8 : i64, "?"]]]

//                  in place, forward: the full tile's vector load and store at the same
//                  position t; the shuffle scan; 2 barriers per tile
// CHECK:           "gpu.func"() <{function_type = (memref<1000xi32>) -> (), kernel}> ({
// CHECK-NEXT:      ^{{.*}}(%x0: memref<1000xi32>):
// CHECK:             %[[UBASES:.*]] = arith.cmpi eq, %{{.*}}, %{{.*}} : index
//                  tile 0's elements before the loop, by a vector where the tile is full
// CHECK:             scf.if %{{.*}} -> (i32, i32, i32, i32) {
// CHECK-NEXT:          vector.load %x0[%{{.*}}] {alignment = 16 : i64} : memref<1000xi32>, vector<4xi32>
// CHECK:             scf.for %[[UT:[0-9a-z_]+]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[X0:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %[[X1:[0-9a-z_]+]] = %{{[0-9a-z_]+}}, %{{.*}} = %{{[0-9a-z_]+}}, %{{.*}} = %{{[0-9a-z_]+}}) -> (i32, i32, i32, i32) {
// CHECK-NEXT:          %[[UB:.*]] = arith.muli %[[UT]], %{{.*}} : index
// CHECK-NEXT:          %[[U0:.*]] = arith.addi %[[UB]], %{{.*}} : index
// CHECK-NEXT:          arith.cmpi ugt, %[[UT]], %{{.*}} : index
//                      the next tile's loads first (in place: they read tile k + 1, which
//                      this tile does not write)
// CHECK-NEXT:          %[[UN:.*]] = arith.addi %[[UT]], %{{.*}} : index
// CHECK-NEXT:          %[[UNB:.*]] = arith.muli %[[UN]], %{{.*}} : index
// CHECK-NEXT:          %[[UN0:.*]] = arith.addi %[[UNB]], %{{.*}} : index
// CHECK:               %[[UNVEC:.*]] = arith.andi %{{.*}}, %[[UBASES]] : i1
// CHECK-NEXT:          %[[NX0:.*]], %[[NX1:.*]], %[[NX2:.*]], %[[NX3:.*]] = scf.if %[[UNVEC]] -> (i32, i32, i32, i32) {
// CHECK-NEXT:            %[[UV:.*]] = vector.load %x0[%[[UN0]]] {alignment = 16 : i64} : memref<1000xi32>, vector<4xi32>
// CHECK-NEXT:            %[[G0:.*]] = vector.extract %[[UV]][0] : i32 from vector<4xi32>
// CHECK-NEXT:            %[[G1:.*]] = vector.extract %[[UV]][1] : i32 from vector<4xi32>
// CHECK-NEXT:            %[[G2:.*]] = vector.extract %[[UV]][2] : i32 from vector<4xi32>
// CHECK-NEXT:            %[[G3:.*]] = vector.extract %[[UV]][3] : i32 from vector<4xi32>
// CHECK-NEXT:            scf.yield %[[G0]], %[[G1]], %[[G2]], %[[G3]] : i32, i32, i32, i32
// CHECK-NEXT:          } else {
// CHECK-COUNT-4:         memref.load %x0[%{{.*}}] : memref<1000xi32>
// CHECK-NOT:           "gpu.shuffle"
// CHECK:               %[[UINSIDE:.*]] = arith.cmpi ule, %{{.*}}, %{{.*}} : index
// CHECK:               %[[UAL:.*]] = arith.andi %{{.*}}, %{{.*}} : i1
// CHECK-NEXT:          %[[UFULL:.*]] = arith.andi %[[UINSIDE]], %[[UAL]] : i1
// CHECK-NOT:           memref.load %x0
// CHECK:               arith.addi %[[X0]], %[[X1]] : i32
// CHECK-COUNT-6:       "gpu.shuffle"(%{{.*}}) <{mode = #gpu<shuffle_mode up>}> : (i32, i32, i32) -> (i32, i1)
// CHECK:               "gpu.barrier"() : () -> ()
// CHECK:               %[[UST:.*]] = arith.andi %[[UFULL]], %[[UBASES]] : i1
// CHECK-NEXT:          scf.if %[[UST]] {
// CHECK-COUNT-3:         vector.insert
// CHECK-NEXT:            vector.store %{{.*}}, %x0[%[[U0]]] {alignment = 16 : i64} : memref<1000xi32>, vector<4xi32>
// CHECK-NEXT:          } else {
// CHECK-COUNT-4:         memref.store %{{.*}}, %x0[%{{.*}}] : memref<1000xi32>
// CHECK:               "gpu.barrier"() : () -> ()
// CHECK-NOT:           "gpu.barrier"
// CHECK:               memref.store %{{.*}}, %{{.*}}[%{{.*}}] : memref<1xi32, 3 : i64>
// CHECK:               scf.yield %[[NX0]], %[[NX1]], %[[NX2]], %[[NX3]] : i32, i32, i32, i32
// CHECK:           sym_name = "scan_generic_1"{{.*}}grid = [1 : i64, 1 : i64, 1 : i64]{{.*}}shared_bytes = 516 : i64, args = {{\[}}["x0", "inout", "i32", [1000 : i64]]]
