from lora_registry_client.client import ApiError, Client, Unreachable, WaitTimeout

__all__ = ["ApiError", "Client", "Unreachable", "WaitTimeout"]
