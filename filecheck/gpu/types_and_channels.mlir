// RUN: xdsl-opt %s -p 'scan-to-gpu{block-size=8 items-per-thread=1}' | filecheck %s
// f16/bf16 inputs widen with extf, integer states use muli/addi, channels of a 3-d
// operand are delinearised from the block id, dynamic channel counts guard the launch.

func.func @bf16_in(%a: memref<2x3x16xbf16>, %b: memref<2x3x16xbf16>, %h: memref<2x3x16xf32>) {
  scan.affine %a, %b into %h axis 1 : memref<2x3x16xbf16>, memref<2x3x16xbf16> -> memref<2x3x16xf32>
  func.return
}
// CHECK-LABEL: func.func @bf16_in
// CHECK:         %[[N:.*]] = arith.constant 32 : index
// CHECK:         "gpu.launch_func"(%[[N]], {{.*}}) <{kernel = @scanweaver_kernels::@scan_affine_0

func.func @int_dynamic(%x: memref<?x5xi32>, %hx: memref<?x5xi32>) {
  scan.affine %x, %x into %hx axis 1 reverse : memref<?x5xi32>, memref<?x5xi32> -> memref<?x5xi32>
  func.return
}
// CHECK-LABEL: func.func @int_dynamic
// CHECK:         %[[D:.*]] = memref.dim %hx, %{{.*}} : memref<?x5xi32>
// CHECK:         %[[NZ:.*]] = arith.cmpi sgt, %[[D]], %{{.*}} : index
// CHECK-NEXT:    scf.if %[[NZ]] {
// CHECK-NEXT:      "gpu.launch_func"(%[[D]], {{.*}}) <{kernel = @scanweaver_kernels::@scan_affine_1

// CHECK:       "gpu.module"() <{sym_name = "scanweaver_kernels"}> ({
// CHECK:         "gpu.func"() <{function_type = (memref<2x3x16xbf16>, memref<2x3x16xbf16>, memref<2x3x16xf32>) -> (), kernel}>
// CHECK:           %[[BID:.*]] = "gpu.block_id"() <{dimension = #gpu<dim x>}> : () -> index
// CHECK:           %[[C2:.*]] = arith.remui %[[BID]], %{{.*}} : index
// CHECK-NEXT:      %[[C0:.*]] = arith.divui %[[BID]], %{{.*}} : index
// CHECK:           memref.load %a[%[[C0]], %{{.*}}, %[[C2]]] : memref<2x3x16xbf16>
// CHECK-NEXT:      arith.extf %{{.*}} : bf16 to f32
// CHECK:         "gpu.func"() <{function_type = (memref<?x5xi32>, memref<?x5xi32>, memref<?x5xi32>) -> (), kernel}>
// CHECK:           arith.muli %{{.*}}, %{{.*}} : i32
// CHECK:           arith.addi %{{.*}}, %{{.*}} : i32
// CHECK-NOT:       arith.mulf
// CHECK:         }) {sym_name = "scan_affine_1", gpu.kernel, scanweaver.launch = {{.*}}grid = ["h.shape[0]", 1 : i64, 1 : i64]
