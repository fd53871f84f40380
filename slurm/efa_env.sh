# Environment for NCCL over AWS EFA with GPUDirect RDMA (p4d/p5), through libfabric and
# the aws-ofi-nccl plugin. Sourced by the launchers; harmless on machines without EFA.
if command -v fi_info >/dev/null 2>&1 && fi_info -p efa >/dev/null 2>&1; then
  export FI_PROVIDER=efa
  export FI_EFA_USE_DEVICE_RDMA=1     # GPUDirect RDMA
  export FI_EFA_FORK_SAFE=1
  export NCCL_PROTO=simple            # what aws-ofi-nccl recommends on EFA
  export NCCL_SOCKET_IFNAME=^lo,docker
fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
