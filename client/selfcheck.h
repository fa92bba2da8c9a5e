/*
 * selfcheck.h — the `tessera selfcheck` verb (client/selfcheck.c).
 */
#ifndef TS_CLIENT_SELFCHECK_H
#define TS_CLIENT_SELFCHECK_H

/* Runs `tessera selfcheck` with its own arguments (argv[0] is "selfcheck"). Returns the process
 * exit code: 0 every check passed, 1 a check failed or could not run, 2 bad usage. */
int ts_cli_selfcheck(int argc, char **argv);

#endif
