"""Integrations of tuner.attention with model libraries: `routing` (library-free) sends a model's
torch SDPA calls to the tuned kernels, falling back to torch's SDPA for what they cannot honour;
`diffusers` installs it on a diffusers model or pipeline. Importing `tuner` imports none of them,
and none imports its library before it is used."""
