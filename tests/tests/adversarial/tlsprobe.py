#!/usr/bin/env python3
"""TLS probes for the adversarial suite (tests/tests/adversarial.rs).

Two modes, both run inside the guest namespace:

  tlsprobe.py real HOST PORT --sni NAME --ca CA [--path P] [--split-bytes]
                   [--records K] [--alpn-bytes N]
      A real TLS client (Python's ssl over memory BIOs, so the ClientHello's
      bytes are ours to send): the ClientHello is re-framed into K TLS
      records and/or written one byte per TCP segment (TCP_NODELAY, a short
      pause between writes), then the handshake completes normally and one
      HTTP/1.1 GET is sent. --alpn-bytes pads the ALPN list (h2 and http/1.1
      stay offered) until the ClientHello is several KB. Prints the response
      and exits 0 on HTTP 200, 1 otherwise.

  tlsprobe.py craft HOST PORT [--names a,b] [--ech] [--pad N] [--records K]
      Sends a hand-made ClientHello (one server_name extension listing every
      name, an optional encrypted_client_hello extension, an optional
      padding extension of N bytes, framed into K records or as many 16 KiB
      records as needed) and reports what came back: "reset"/"closed" when
      the peer dropped the connection without a byte (exit 1), "reached:
      <hex>" when a TLS peer answered (exit 0: the hello got through).
"""

import argparse
import os
import socket
import ssl
import struct
import sys
import time

MAX_RECORD = 16384


def frame(handshake, records):
    """Frames a handshake message into TLS handshake records."""
    if records <= 0:
        records = max(1, -(-len(handshake) // MAX_RECORD))
    size = max(1, -(-len(handshake) // records))
    size = min(size, MAX_RECORD)
    out = b""
    for i in range(0, len(handshake), size):
        chunk = handshake[i:i + size]
        out += b"\x16\x03\x01" + struct.pack(">H", len(chunk)) + chunk
    return out


def unframe(records_bytes):
    """The handshake bytes carried by a sequence of handshake records."""
    out = b""
    i = 0
    while i < len(records_bytes):
        typ = records_bytes[i]
        (n,) = struct.unpack(">H", records_bytes[i + 3:i + 5])
        if typ != 0x16:
            raise ValueError("not a handshake record")
        out += records_bytes[i + 5:i + 5 + n]
        i += 5 + n
    return out


def send(sock, data, split_bytes):
    if not split_bytes:
        sock.sendall(data)
        return
    for i in range(len(data)):
        sock.sendall(data[i:i + 1])
        # With TCP_NODELAY each write leaves as its own segment; the pause
        # keeps the kernel from coalescing writes queued behind each other.
        time.sleep(0.001)


def real(args):
    ctx = ssl.create_default_context(cafile=args.ca)
    alpn = ["http/1.1", "h2"] if args.h2 else ["http/1.1"]
    n = 0
    while args.alpn_bytes and n * 101 < args.alpn_bytes:
        alpn.append("x-pad-%03d-" % n + "p" * 90)
        n += 1
    ctx.set_alpn_protocols(alpn)
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(inc, out, server_hostname=args.sni)
    try:
        tls.do_handshake()
    except ssl.SSLWantReadError:
        pass
    hello_records = out.read()
    hello = frame(unframe(hello_records), args.records)
    print("clienthello %d bytes in %d record bytes" % (len(unframe(hello_records)), len(hello)),
          file=sys.stderr)
    sock = socket.create_connection((args.host, args.port), timeout=60)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    started = time.monotonic()
    send(sock, hello, args.split_bytes)
    # The gateway gives a ClientHello a few seconds to arrive whole: say how
    # long this one took, for a failure on a loaded machine.
    print("clienthello sent in %.2f s" % (time.monotonic() - started), file=sys.stderr)
    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pending = out.read()
            if pending:
                sock.sendall(pending)
            data = sock.recv(65536)
            if not data:
                print("closed during handshake")
                return 1
            inc.write(data)
    pending = out.read()
    if pending:
        sock.sendall(pending)
    req = "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (args.path, args.sni)
    tls.write(req.encode())
    sock.sendall(out.read())
    body = b""
    while True:
        try:
            chunk = tls.read(65536)
            if not chunk:
                break
            body += chunk
            continue
        except ssl.SSLWantReadError:
            pass
        except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
            break
        data = sock.recv(65536)
        if not data:
            break
        inc.write(data)
    text = body.decode("latin-1")
    print(text)
    return 0 if text.startswith("HTTP/1.1 200") else 1


def crafted_hello(names, ech, pad):
    exts = b""
    if names:
        lst = b"".join(b"\x00" + struct.pack(">H", len(n)) + n.encode() for n in names)
        exts += b"\x00\x00" + struct.pack(">HH", len(lst) + 2, len(lst)) + lst
    # supported_versions: TLS 1.3; supported_groups: x25519; key_share: x25519.
    exts += bytes([0x00, 0x2B, 0x00, 0x03, 0x02, 0x03, 0x04])
    exts += bytes([0x00, 0x0A, 0x00, 0x04, 0x00, 0x02, 0x00, 0x1D])
    share = os.urandom(32)
    exts += b"\x00\x33" + struct.pack(">HHH", 38, 36, 0x1D) + struct.pack(">H", 32) + share
    exts += bytes([0x00, 0x0D, 0x00, 0x04, 0x00, 0x02, 0x08, 0x04])
    if ech:
        # Outer ECH: type 0, HKDF-SHA256, AES-128-GCM, config id 7, a 32-byte
        # enc and a 128-byte payload (what GREASE ECH looks like, too).
        body = bytes([0, 0, 1, 0, 1, 7]) + struct.pack(">H", 32) + os.urandom(32)
        body += struct.pack(">H", 128) + os.urandom(128)
        exts += b"\xfe\x0d" + struct.pack(">H", len(body)) + body
    if pad:
        exts += b"\x00\x15" + struct.pack(">H", pad) + b"\x00" * pad
    hello = b"\x03\x03" + os.urandom(32) + b"\x20" + os.urandom(32)
    hello += b"\x00\x02\x13\x01" + b"\x01\x00"
    hello += struct.pack(">H", len(exts)) + exts
    return b"\x01" + struct.pack(">I", len(hello))[1:] + hello


def craft(args):
    names = [n for n in args.names.split(",") if n] if args.names else []
    hello = crafted_hello(names, args.ech, args.pad)
    data = frame(hello, args.records)
    print("clienthello %d bytes in %d record bytes" % (len(hello), len(data)), file=sys.stderr)
    sock = socket.create_connection((args.host, args.port), timeout=60)
    try:
        sock.sendall(data)
        got = sock.recv(4096)
    except ConnectionResetError:
        print("reset")
        return 1
    except socket.timeout:
        print("timeout")
        return 1
    if not got:
        print("closed")
        return 1
    print("reached: " + got[:16].hex())
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["real", "craft"])
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--sni")
    p.add_argument("--ca")
    p.add_argument("--path", default="/")
    p.add_argument("--split-bytes", action="store_true")
    p.add_argument("--records", type=int, default=0)
    p.add_argument("--alpn-bytes", type=int, default=0)
    p.add_argument("--h2", action="store_true")
    p.add_argument("--names")
    p.add_argument("--ech", action="store_true")
    p.add_argument("--pad", type=int, default=0)
    args = p.parse_args()
    try:
        return real(args) if args.mode == "real" else craft(args)
    except (ConnectionResetError, BrokenPipeError):
        print("reset")
        return 1
    except (socket.timeout, TimeoutError):
        print("timeout")
        return 1
    except ssl.SSLError as e:
        print("tls error: %s" % e)
        return 1


if __name__ == "__main__":
    sys.exit(main())
