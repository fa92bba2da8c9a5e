/*
 * commands.h — the verbs of `tessera`, one function each: (argc, argv) with argv[0] the verb,
 * returning the process exit code (0 ok, 1 failed, 2 bad usage, 130 interrupted).
 */
#ifndef TS_COMMANDS_H
#define TS_COMMANDS_H

int ts_cmd_train(int argc, char **argv);
int ts_cmd_sample(int argc, char **argv);
int ts_cmd_forward(int argc, char **argv);
int ts_cmd_store(int argc, char **argv);
int ts_cmd_partition(int argc, char **argv);
int ts_cmd_train_classifier(int argc, char **argv);
int ts_cmd_train_judge(int argc, char **argv);
int ts_cmd_judge(int argc, char **argv);
int ts_cmd_encode(int argc, char **argv);
int ts_cmd_import(int argc, char **argv);
int ts_cmd_train_router(int argc, char **argv);
int ts_cmd_calibrate(int argc, char **argv);
int ts_cmd_generate(int argc, char **argv);
int ts_cmd_eval(int argc, char **argv);
int ts_cmd_loss(int argc, char **argv);
int ts_cmd_keygen(int argc, char **argv);
int ts_cmd_ping(int argc, char **argv);
int ts_cmd_status(int argc, char **argv);
int ts_cmd_up(int argc, char **argv);
int ts_cmd_down(int argc, char **argv);
int ts_cmd_network(int argc, char **argv);
int ts_cmd_join(int argc, char **argv);
int ts_cmd_pull(int argc, char **argv);
/* 0 every check passed, 1 a check failed or could not run, 2 bad usage. */
int ts_cmd_selfcheck(int argc, char **argv);

#endif
