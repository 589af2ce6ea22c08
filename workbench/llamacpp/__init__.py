"""The real llama.cpp inside the workbench: its build, a ctypes layer over libllama, its
runtime switches, its CUDA kernel names and the worker process that runs one configuration."""
