// initcheck probe: does compute-sanitizer see cuBLAS's writes of C?
#include <cstdio>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
__global__ void k_read_after_f32(const float *c, float *s, int n) { float a = 0; for (int i = threadIdx.x; i < n; i += blockDim.x) a += c[i]; atomicAdd(s, a); }
__global__ void k_read_after_bf16(const float *c, float *s, int n) { float a = 0; for (int i = threadIdx.x; i < n; i += blockDim.x) a += c[i]; atomicAdd(s, a); }
__global__ void k_read_after_f16(const float *c, float *s, int n) { float a = 0; for (int i = threadIdx.x; i < n; i += blockDim.x) a += c[i]; atomicAdd(s, a); }
int main(int argc, char **argv) {
    int M = argc > 1 ? atoi(argv[1]) : 512, N = argc > 2 ? atoi(argv[2]) : 384, K = argc > 3 ? atoi(argv[3]) : 128;
    cublasHandle_t h; cublasCreate(&h);
    float *A, *B, *C, *s; void *A16, *B16;
    cudaMalloc(&A, 4L*M*K); cudaMalloc(&B, 4L*N*K); cudaMalloc(&s, 4); cudaMemset(s, 0, 4);
    cudaMemset(A, 0, 4L*M*K); cudaMemset(B, 0, 4L*N*K);
    cudaMalloc(&A16, 2L*M*K); cudaMalloc(&B16, 2L*N*K); cudaMemset(A16, 0, 2L*M*K); cudaMemset(B16, 0, 2L*N*K);
    float one = 1, zero = 0;
    cudaMalloc(&C, 4L*M*N);
    int st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B, CUDA_R_32F, K, A, CUDA_R_32F, K, &zero, C, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    k_read_after_f32<<<1, 256>>>(C, s, M*N); cudaDeviceSynchronize(); cudaFree(C);
    cudaMalloc(&C, 4L*M*N);
    int st2 = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B16, CUDA_R_16BF, K, A16, CUDA_R_16BF, K, &zero, C, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    k_read_after_bf16<<<1, 256>>>(C, s, M*N); cudaDeviceSynchronize(); cudaFree(C);
    cudaMalloc(&C, 4L*M*N);
    int st3 = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, B16, CUDA_R_16F, K, A16, CUDA_R_16F, K, &zero, C, CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    k_read_after_f16<<<1, 256>>>(C, s, M*N); cudaDeviceSynchronize();
    float hs; cudaMemcpy(&hs, s, 4, cudaMemcpyDeviceToHost);
    printf("probe M=%d N=%d K=%d: status %d %d %d, sum %g (0 expected), %s\n", M, N, K, st, st2, st3, hs, cudaGetErrorString(cudaGetLastError()));
    return 0;
}
