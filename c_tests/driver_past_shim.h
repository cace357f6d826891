/* The pooling proof's question, asked of the driver itself: is this pointer
 * memory of a stream-ordered pool (CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE
 * non-null)? The shim answers that attribute as for cudaMalloc memory (no
 * pool) and serves dlsym and cuGetProcAddress, so the driver's function is
 * read from the loaded libcuda's own symbol table. Plain C (define
 * _GNU_SOURCE first; C++ compilers do), for every test program that proves
 * pooling. */
#ifndef SOMASHIM_DRIVER_PAST_SHIM_H
#define SOMASHIM_DRIVER_PAST_SHIM_H
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct driver_symbol { const char *name; void *found; };

static int driver_symbol_visit(struct dl_phdr_info *info, size_t size, void *arg) {
  struct driver_symbol *want = (struct driver_symbol *)arg;
  (void)size;
  if (!info->dlpi_name || !strstr(info->dlpi_name, "libcuda.so")) return 0;
  int fd = open(info->dlpi_name, O_RDONLY);
  if (fd < 0) return 0;
  struct stat st;
  const unsigned char *file = NULL;
  if (fstat(fd, &st) == 0) file = (const unsigned char *)mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (!file || file == MAP_FAILED) return 0;
  const Elf64_Ehdr *eh = (const Elf64_Ehdr *)file;
  const Elf64_Shdr *sh = (const Elf64_Shdr *)(file + eh->e_shoff);
  int valid = (size_t)st.st_size >= sizeof *eh && memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 &&
              eh->e_ident[EI_CLASS] == ELFCLASS64 && eh->e_shentsize == sizeof *sh &&
              eh->e_shoff + (size_t)eh->e_shnum * sizeof *sh <= (size_t)st.st_size;
  for (int i = 0; valid && i < eh->e_shnum && !want->found; i++) {
    if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_offset + sh[i].sh_size > (size_t)st.st_size) continue;
    const Elf64_Sym *sym = (const Elf64_Sym *)(file + sh[i].sh_offset);
    const char *names = (const char *)(file + sh[sh[i].sh_link].sh_offset);
    for (size_t k = 0; k < sh[i].sh_size / sizeof *sym && !want->found; k++)
      if (sym[k].st_shndx != SHN_UNDEF && ELF64_ST_TYPE(sym[k].st_info) == STT_FUNC &&
          strcmp(names + sym[k].st_name, want->name) == 0)
        want->found = (void *)(info->dlpi_addr + sym[k].st_value);
  }
  munmap((void *)file, st.st_size);
  return want->found != NULL;
}

/* 1 if the driver says p is pool memory; 0 if not; exits 3 if the program
 * has no libcuda loaded or it lacks the function. */
static inline int driver_says_pooled(uint64_t p) {
  typedef int (*attribute_fn)(void *, int, uint64_t);
  static attribute_fn attribute;
  if (!attribute) {
    struct driver_symbol want = {"cuPointerGetAttribute", NULL};
    dl_iterate_phdr(driver_symbol_visit, &want);
    attribute = (attribute_fn)want.found;
    if (!attribute) {
      fprintf(stderr, "driver_past_shim: no cuPointerGetAttribute in a loaded libcuda\n");
      exit(3);
    }
  }
  void *pool = NULL;
  return p && attribute(&pool, 17 /* CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE */, p) == 0 && pool != NULL;
}
#endif
