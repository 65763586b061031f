#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <unistd.h>
#include <time.h>
#include <sys/wait.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e3+t.tv_nsec/1e6;}
int main(int argc,char**argv){int n=atoi(argv[1]); int rounds=atoi(argv[2]); int forkonly=argc>3;
 double tot=0;
 for(int r=0;r<rounds;r++){ pid_t p[1000];
  for(int i=0;i<n;i++){ p[i]=fork(); if(!p[i]){ if(forkonly) pause(); execl("/bin/sleep","sleep","1000",NULL); _exit(1);} }
  usleep(100000);
  double t=now(); for(int i=0;i<n;i++) kill(p[i],SIGKILL); for(int i=0;i<n;i++) waitpid(p[i],0,0); double e=now()-t; tot+=e; }
 printf("n=%d %s: mean %.3f ms to kill and reap\n",n,forkonly?"forked (no exec)":"exec sleep",tot/rounds);}
