"""What the PyTorch peers (pytorch_gpt2.py, pytorch_llama.py) share: how this process's
PyTorch was set up (as installed, or tuned by pytorch_tuned.sh), read from what is loaded
(/proc/self/maps), and the table row in the format of build/bench/throughput."""
import ctypes, os, resource


def setup():
    """'stock: <BLAS>' or 'tuned: tcmalloc, <BLAS>', from the libraries this process mapped."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if path.startswith("/"):
                libs.add(os.path.realpath(path))
    tcmalloc = any("libtcmalloc" in os.path.basename(p) for p in libs)
    openblas = sorted(p for p in libs if os.path.basename(p).startswith("libopenblas"))
    if openblas:
        lib = ctypes.CDLL(openblas[0])  # the mapped one: the same handle
        lib.openblas_get_corename.restype = lib.openblas_get_config.restype = ctypes.c_char_p
        config = lib.openblas_get_config().decode()
        threading = "OpenMP" if "USE_OPENMP" in config else "pthreads"
        version = config.split()[1] if config.startswith("OpenBLAS ") else "?"
        blas = f"OpenBLAS {version} {threading}, {lib.openblas_get_corename().decode()} kernels"
    elif any(os.path.basename(p).startswith("libblas.so") and "/blas/" in p for p in libs):
        blas = "reference BLAS"
    else:
        blas = "BLAS: " + (",".join(sorted(os.path.basename(p) for p in libs if "blas" in p)) or "?")
    return ("tuned: tcmalloc, " if tcmalloc else "stock: ") + blas


def row(torch, describe, B, T, step_s, flops_per_token, peak):
    gflops = flops_per_token * B * T / step_s / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    share = f"{100 * gflops / peak:.1f}%" if peak > 0 else "?"
    return (f"| PyTorch {torch.__version__} {describe} ({setup()}) | {B} x {T} | {torch.get_num_threads()} | "
            f"{step_s:.3f} | {B * T / step_s:.0f} | {gflops:.1f} | {peak:.1f} | {share} | {rss:.2f} | |")
