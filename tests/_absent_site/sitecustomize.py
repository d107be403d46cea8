"""Loaded at start-up by a child process whose PYTHONPATH starts here: PyAV without the encoders that
``STREAMVAE_TEST_ABSENT_ENCODERS`` names, patched before anything imports streamvae (see
``tests/_absent_encoders``)."""

from tests._absent_encoders import install_from_environment

install_from_environment()
