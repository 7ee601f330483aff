"""End-to-end encryption of the layers clients exchange through the server.

Every client holds one X25519 key pair per run. Two clients derive the same
256-bit AES key from their key pair and the other's public key (X25519 key
agreement, then HKDF-SHA256), and every layer travels AES-GCM encrypted under
the key of its sender and receiver, with associated data that names the
round, repetition, stage, attempt, sender, receiver and layer index. The
server relays the ciphertext but holds no private key, so it cannot read it;
a ciphertext moved to another round, stage, pair or layer slot fails
authentication.

Only the clients use this module. The server-side relay never imports it.
"""

import os

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: Length of the AES-GCM nonce that starts every payload.
NONCE_BYTES = 12
#: Length of the AES-GCM authentication tag that ends every payload.
TAG_BYTES = 16
#: Protocol label mixed into key derivation and associated data, so keys and
#: ciphertexts of this protocol cannot be confused with any other use.
PROTOCOL_LABEL = b"fedx secure recombination v1"

_RAW = serialization.Encoding.Raw


def new_private_key() -> bytes:
    """Generate a fresh X25519 private key (32 raw bytes) from the OS's CSPRNG."""
    return X25519PrivateKey.generate().private_bytes(
        _RAW, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def public_key(private_key: bytes) -> bytes:
    """Return the 32-byte X25519 public key of ``private_key``."""
    return (
        X25519PrivateKey.from_private_bytes(private_key)
        .public_key()
        .public_bytes(_RAW, serialization.PublicFormat.Raw)
    )


def pair_key(private_key: bytes, peer_public_key: bytes) -> bytes:
    """Derive the AES-256 key that this client shares with one peer.

    Both ends compute the same key: the X25519 shared secret is symmetric and
    the HKDF ``info`` holds both public keys in sorted order.

    Raises
    ------
    ValueError
        When ``peer_public_key`` is not a valid X25519 public key (for
        example a low-order point, which would give an all-zero secret).
    """
    own = X25519PrivateKey.from_private_bytes(private_key)
    peer = X25519PublicKey.from_public_bytes(peer_public_key)
    secret = own.exchange(peer)
    own_public = own.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)
    info = PROTOCOL_LABEL + b"".join(sorted((own_public, peer_public_key)))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret)


# pylint: disable=too-many-arguments
def associated_data(
    *,
    server_round: int,
    repeat: int,
    stage: str,
    attempt: int,
    sender: int,
    receiver: int,
    layer: int,
) -> bytes:
    """Bind a ciphertext to where it belongs in the protocol.

    AES-GCM authenticates these bytes along with the ciphertext, so the relay
    cannot replay a layer in another round or repetition, turn a sent layer
    into a returned one, deliver it to a client it was not sealed for, claim
    another sender, or put it in another layer slot.
    """
    fields = (
        f"round={server_round}|repeat={repeat}|stage={stage}|attempt={attempt}"
        f"|from={sender}|to={receiver}|layer={layer}"
    )
    return PROTOCOL_LABEL + b"|" + fields.encode("ascii")


def seal(key: bytes, plaintext: bytes, data: bytes) -> bytes:
    """Encrypt and authenticate ``plaintext``: returns nonce + ciphertext + tag.

    The nonce is random; with a fresh key per pair and run and at most a few
    thousand payloads per key, a 96-bit random nonce never repeats in practice.
    """
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, data)


def open_sealed(key: bytes, payload: bytes, data: bytes) -> bytes:
    """Decrypt a :func:`seal` payload.

    Raises
    ------
    cryptography.exceptions.InvalidTag
        When the payload was altered, sealed under another key or with other
        associated data.
    """
    if len(payload) < NONCE_BYTES + TAG_BYTES:
        raise ValueError(f"payload of {len(payload)} bytes is too short to be sealed")
    return AESGCM(key).decrypt(payload[:NONCE_BYTES], payload[NONCE_BYTES:], data)
