#!/usr/bin/env python3
"""A guest flooding the gateway with allowed traffic (tests/tests/adversarial.rs).

  flood.py NAME ADDR SECONDS

For SECONDS, in turn: one DNS query (type A) for NAME to the resolver in
/etc/resolv.conf, then one plain-HTTP GET /flood/<i> to ADDR:80 with
`Host: NAME`, all on one kept-alive connection (reopened only if the server
closes it). Every query must be answered and every request answered 200, or
the script exits 1. Prints one line: `dns Q http M connections C`.
"""

import http.client
import random
import socket
import struct
import sys
import time


def resolver():
    with open("/etc/resolv.conf") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                return parts[1]
    sys.exit("no nameserver in /etc/resolv.conf")


def query(sock, server, name):
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\x00" + struct.pack(">HH", 1, 1)
    sock.sendto(q, (server, 53))
    while True:
        data, _ = sock.recvfrom(4096)
        if len(data) >= 4 and struct.unpack(">H", data[:2])[0] == qid:
            rcode = data[3] & 0x0F
            if rcode != 0:
                sys.exit(f"query {name}: rcode {rcode}")
            return


def main():
    name, addr, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    server = resolver()
    dns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    dns.settimeout(10)
    conn, connections = None, 0
    queries = requests = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        query(dns, server, name)
        queries += 1
        if conn is None or conn.sock is None:
            conn = http.client.HTTPConnection(addr, 80, timeout=30)
            connections += 1
        conn.request("GET", f"/flood/{requests}", headers={"Host": name})
        resp = conn.getresponse()
        resp.read()
        if resp.status != 200:
            sys.exit(f"request {requests}: status {resp.status}")
        requests += 1
    conn.close()
    print(f"dns {queries} http {requests} connections {connections}")


main()
