"""build-sandbox-image: requirements.txt in, verified sandbox runtime image out."""
