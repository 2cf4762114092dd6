/** Why the build is not current, in a few words (`no build yet`, `src/Cli.ts changed`); null when current. */
export declare const staleness: (packageDir: string, built?: string, metafile?: string) => string | null
