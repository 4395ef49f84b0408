class _Unavailable:
    def __getattr__(self, name):
        raise RuntimeError(f"torch_memory_saver.{name}: CUDA memory offload is stubbed on this CPU machine")


torch_memory_saver = _Unavailable()
