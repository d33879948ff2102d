"""The seccomp filter, read back by a small classic-BPF interpreter: what each system call gets, on each
architecture sftdoctor knows; its numbers against the kernel headers installed here; the Docker profile says
the same. (The filter in force, under bubblewrap, is tested in test_sandbox.py.)"""

from __future__ import annotations

import errno
import re
import struct
from pathlib import Path

import pytest

from sftdoctor.eval import seccomp

ALLOW, KILL = 0x7FFF0000, 0x80000000
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17


def verdict(program: bytes, nr: int, arch: int, arg0: int = 0) -> int:
    """Run the filter on one struct seccomp_data (little-endian, as on x86_64 and aarch64)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, arg0 & 0xFFFFFFFFFFFFFFFF, 0, 0, 0, 0, 0)
    code = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        op, jt, jf, k = code[pc]
        if op == 0x20:  # ld [k]
            acc = struct.unpack_from("<I", data, k)[0]
            pc += 1
        elif op in (0x15, 0x35, 0x45):  # jeq, jge, jset
            hit = acc == k if op == 0x15 else acc >= k if op == 0x35 else bool(acc & k)
            pc += 1 + (jt if hit else jf)
        elif op == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected opcode {op:#x} at {pc}")


def eperm(value: int) -> bool:
    return value == 0x00050000 | errno.EPERM


@pytest.mark.parametrize("arch", sorted(seccomp.ARCHES))
def test_every_refused_call_gets_eperm_and_the_rest_run(arch):
    column, audit = seccomp.ARCHES[arch]
    program = seccomp.program(arch)
    refused = {numbers[column] for numbers in seccomp.REFUSED.values()}
    for number in refused:
        assert eperm(verdict(program, number, audit)), (arch, number)
    clone, clone3 = seccomp.CLONE[column], seccomp.CLONE3[column]
    for number in set(range(460)) - refused - {clone, clone3}:
        assert verdict(program, number, audit) == ALLOW, (arch, number)
    assert verdict(program, clone3, audit) == 0x00050000 | errno.ENOSYS  # glibc falls back to clone
    assert verdict(program, clone, audit, SIGCHLD) == ALLOW  # fork
    assert verdict(program, clone, audit, 0x3D0F00) == ALLOW  # pthread_create's flags
    assert eperm(verdict(program, clone, audit, CLONE_NEWUSER | SIGCHLD))
    assert eperm(verdict(program, clone, audit, CLONE_NEWNET))


def test_the_calls_that_reach_past_the_walls_are_among_them():
    """By their x86_64 numbers, written here apart from the table: ptrace, process_vm_readv/writev,
    pidfd_getfd, keyctl, add_key, request_key, memfd_create, io_uring_setup, unshare."""
    program = seccomp.program("x86_64")
    for number in (101, 310, 311, 438, 250, 248, 249, 319, 425, 272):
        assert eperm(verdict(program, number, seccomp.ARCHES["x86_64"][1])), number


def test_another_architecture_is_killed_and_x32_refused():
    program = seccomp.program("x86_64")
    assert verdict(program, 101, 0x40000003) == KILL  # i386 (int 0x80) on x86_64: the numbers differ
    assert eperm(verdict(program, 0x40000000 | 39, seccomp.ARCHES["x86_64"][1]))  # x32's getpid
    assert seccomp.program("riscv64") is None


def test_the_numbers_are_the_kernel_headers():
    headers = {
        "x86_64": Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        "aarch64": Path("/usr/include/asm-generic/unistd.h"),
    }
    checked = 0
    for arch, header in headers.items():
        if not header.exists():
            continue
        text = header.read_text()
        column = seccomp.ARCHES[arch][0]
        names = {
            **{name: numbers[column] for name, numbers in seccomp.REFUSED.items()},
            "clone": seccomp.CLONE[column],
            "clone3": seccomp.CLONE3[column],
        }
        for name, number in names.items():
            found = re.search(rf"#define __NR(?:3264)?_{name}\s+(\d+)", text)
            assert found and int(found.group(1)) == number, (arch, name)
            checked += 1
    assert checked, "no kernel uapi headers here to check the numbers against (linux-libc-dev)"


def test_the_docker_profile_refuses_the_same_calls():
    profile = seccomp.docker_profile()
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW"
    rules = profile["syscalls"]
    assert set(rules[0]["names"]) == set(seccomp.REFUSED) and rules[0]["errnoRet"] == errno.EPERM
    assert rules[1] == {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS}
    flags = {rule["args"][0]["value"] for rule in rules[2:] if rule["names"] == ["clone"]}
    assert sum(flags) == seccomp.CLONE_NAMESPACES and CLONE_NEWUSER in flags
