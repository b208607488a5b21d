export { goneSlurmJobs, slurmJobOf, SlurmUnanswered, type SlurmJobRef } from './watch.ts';
